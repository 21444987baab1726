"""The Grafana adapter against the Grafana HTTP API stand-in, over real HTTP.

Cases: a region is opened at the fault with pitcrew's tags and the dashboard's uid, then its
end is patched; 5xx, 429, a stopped server and a timeout are transient (and the same call
succeeds once Grafana is back on its port); a bad token, a token without the permission and
an unknown annotation are permanent; a rotated token file is picked up; the probe reports
reachable-and-allowed, or what is missing, and changes nothing.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from aiohttp import web
from pydantic import ValidationError

from bot.config import Settings
from bot.engine.errors import PermanentError, Reason, TransientError
from bot.engine.ports import Annotator, Probeable, Region
from bot.integrations.grafana import GrafanaAnnotations
from bot.runtime import annotator
from bot.store.base import Deposed
from bot.store.lease import Fence
from tests.grafana.server import READ_ONLY, TOKEN, GrafanaStandin

FAULT = datetime(2026, 12, 1, 3, 4, 5, 678000, tzinfo=UTC)
REGION = Region("inc-0001", "gpu-node-02", "gpu-lost", "replace-node", FAULT, "XID 79 gpu3")


def _adapter(
    grafana: GrafanaStandin, tmp_path: Path, token: str = TOKEN, fence: Fence | None = None, **kw: float
) -> GrafanaAnnotations:
    token_file = tmp_path / "grafana-token"
    token_file.write_text(token + "\n")
    return GrafanaAnnotations(grafana.url, token_file, dashboard_uid="pitcrew-incidents", fence=fence, **kw)


async def test_open_then_close_a_region(grafana: GrafanaStandin, tmp_path: Path) -> None:
    adapter = _adapter(grafana, tmp_path)
    assert isinstance(adapter, Annotator) and isinstance(adapter, Probeable)
    try:
        annotation_id = await adapter.open_region(REGION)
        made = grafana.world.annotations[annotation_id]
        assert made.time == 1796094245678 and made.time_end is None
        assert made.tags == ["pitcrew", "gpu-node-02", "gpu-lost", "replace-node", "incident:inc-0001"]
        assert made.dashboard_uid == "pitcrew-incidents"
        assert made.text == "pitcrew inc-0001: XID 79 gpu3 on gpu-node-02"
        assert await adapter.find_region("inc-0001") == annotation_id
        assert await adapter.find_region("inc-0002") is None
        await adapter.close_region(annotation_id, FAULT + timedelta(minutes=12), "done")
        assert made.time_end == made.time + 12 * 60 * 1000 and made.text == "done"
        assert [(m, p) for m, p, _ in grafana.world.requests] == [
            ("POST", "/api/annotations"),
            ("GET", "/api/annotations"),
            ("GET", "/api/annotations"),
            ("PATCH", f"/api/annotations/{annotation_id}"),
        ]
    finally:
        await adapter.aclose()


async def test_a_fenced_adapter_changes_nothing_once_the_lease_may_have_lapsed(
    grafana: GrafanaStandin, tmp_path: Path
) -> None:
    """The outbox's adapter (``pitcrew serve`` fences it) asks the fence before each change:
    while leading it opens a region; once the lease may have lapsed by the process's clock
    (woken from a stop in the middle of a delivery) the close raises ``Deposed`` unsent, and
    a standby sends no change at all; reads (``find_region``) still go."""
    now = [0.0]
    fence = Fence("leader-a", monotonic=lambda: now[0])
    fence.grant(1, valid_until=10.0)
    adapter = _adapter(grafana, tmp_path, fence=fence)
    try:
        annotation_id = await adapter.open_region(REGION)
        now[0] = 11.0
        with pytest.raises(Deposed, match="may have lapsed"):
            await adapter.close_region(annotation_id, FAULT + timedelta(minutes=1), "done")
        fence.revoke()
        with pytest.raises(Deposed, match="standing by"):
            await adapter.open_region(REGION)
        assert await adapter.find_region("inc-0001") == annotation_id
        assert [m for m, _, _ in grafana.world.requests] == ["POST", "GET"]
    finally:
        await adapter.aclose()


async def test_a_lease_lapsed_while_connecting_sends_nothing(grafana: GrafanaStandin, tmp_path: Path) -> None:
    """The fence is asked again once the connection is held (``bot.integrations.fenced``): the
    process passes the call's first check, then stalls while it connects (its clock reads past
    the lease from then on). The request raises ``Deposed`` and Grafana never sees it."""
    readings = iter([0.0])  # the call's first check; every later reading is after the stall
    fence = Fence("leader-a", monotonic=lambda: next(readings, 100.0))
    fence.grant(1, valid_until=10.0)
    told: list[str] = []
    fence.on_deposed(told.append)
    adapter = _adapter(grafana, tmp_path, fence=fence)
    try:
        with pytest.raises(Deposed, match="may have lapsed"):
            await adapter.open_region(REGION)
        assert grafana.world.requests == [] and not grafana.world.annotations
        assert told and "epoch 1" in told[0]
    finally:
        await adapter.aclose()


@pytest.mark.parametrize(
    ("status", "reason"), [(500, "unavailable"), (503, "unavailable"), (429, "rate_limited")]
)
async def test_server_errors_are_transient(
    grafana: GrafanaStandin, tmp_path: Path, status: int, reason: str
) -> None:
    adapter = _adapter(grafana, tmp_path)
    try:
        grafana.fail(status)
        with pytest.raises(TransientError) as caught:
            await adapter.open_region(REGION)
        assert caught.value.reason == reason
        assert not grafana.world.annotations
        assert await adapter.open_region(REGION) == 1  # the retry succeeds
    finally:
        await adapter.aclose()


async def test_unreachable_is_transient_until_grafana_is_back(
    grafana: GrafanaStandin, tmp_path: Path
) -> None:
    adapter = _adapter(grafana, tmp_path)
    try:
        annotation_id = await adapter.open_region(REGION)
        await grafana.stop()
        with pytest.raises(TransientError) as caught:
            await adapter.close_region(annotation_id, FAULT + timedelta(minutes=1))
        assert caught.value.reason == "unreachable"
        probe = await adapter.probe()
        assert not probe.ok and "unreachable" in probe.detail
        await grafana.start()  # same port
        await adapter.close_region(annotation_id, FAULT + timedelta(minutes=1))
        assert grafana.world.annotations[annotation_id].time_end is not None
    finally:
        await adapter.aclose()


async def test_a_slow_grafana_times_out_as_transient(tmp_path: Path) -> None:
    async def hang(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/api/annotations", hang)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    adapter = GrafanaAnnotations(f"http://127.0.0.1:{port}", token_file, timeout=0.2)
    try:
        with pytest.raises(TransientError) as caught:
            await adapter.open_region(REGION)
        assert caught.value.reason == "timeout"
    finally:
        await adapter.aclose()
        await runner.cleanup()


@pytest.mark.parametrize(
    ("token", "reason", "missing"),
    [
        ("glsa_wrong", "unauthorized", ("a valid service-account token",)),
        (READ_ONLY, "forbidden", ()),
    ],
)
async def test_tokens_grafana_refuses_are_permanent(
    grafana: GrafanaStandin, tmp_path: Path, token: str, reason: str, missing: tuple[str, ...]
) -> None:
    adapter = _adapter(grafana, tmp_path, token)
    try:
        with pytest.raises(PermanentError) as caught:
            await adapter.open_region(REGION)
        assert caught.value.reason == reason
        assert TOKEN not in str(caught.value) and token not in str(caught.value)
        probe = await adapter.probe()
        assert probe.ok is (reason == "forbidden")  # a read-only token reads; the write is refused later
        assert probe.missing == missing
        assert not grafana.world.annotations
    finally:
        await adapter.aclose()


async def test_an_unknown_annotation_is_permanent(grafana: GrafanaStandin, tmp_path: Path) -> None:
    adapter = _adapter(grafana, tmp_path)
    try:
        with pytest.raises(PermanentError) as caught:
            await adapter.close_region(42, FAULT)
        assert caught.value.reason == "not_found"
    finally:
        await adapter.aclose()


async def test_a_rotated_token_file_is_read_again(grafana: GrafanaStandin, tmp_path: Path) -> None:
    adapter = _adapter(grafana, tmp_path, "glsa_old")
    try:
        with pytest.raises(PermanentError):
            await adapter.open_region(REGION)
        (tmp_path / "grafana-token").write_text(TOKEN)
        assert await adapter.open_region(REGION) == 1
        (tmp_path / "grafana-token").write_text("")
        with pytest.raises(PermanentError) as caught:
            await adapter.open_region(REGION)
        assert caught.value.reason == Reason.NO_CREDENTIALS
    finally:
        await adapter.aclose()


async def test_the_probe_names_the_version_and_writes_nothing(
    grafana: GrafanaStandin, tmp_path: Path
) -> None:
    adapter = _adapter(grafana, tmp_path)
    try:
        probe = await adapter.probe()
        assert (probe.system, probe.ok, probe.missing) == ("grafana", True, ())
        assert "Grafana 11.3.0" in probe.detail
        assert {m for m, _, _ in grafana.world.requests} == {"GET"} and not grafana.world.annotations
    finally:
        await adapter.aclose()


def test_settings_build_the_adapter_only_with_a_token(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match=r"grafana\.token_file needs grafana\.url or grafana\.api_url"):
        Settings.model_validate({"grafana": {"token_file": str(tmp_path / "token")}})
    assert annotator(Settings()) is None
    assert (
        annotator(Settings.model_validate({"grafana": {"url": "http://grafana:3000"}})) is None
    )  # links only
    token = tmp_path / "token"
    built = annotator(
        Settings.model_validate({"grafana": {"url": "http://grafana:3000/", "token_file": str(token)}})
    )
    assert isinstance(built, GrafanaAnnotations)


async def test_api_url_is_where_pitcrew_calls_and_url_where_people_look(
    grafana: GrafanaStandin, tmp_path: Path
) -> None:
    """Grafana opened at its public address, called at the in-cluster Service (``api_url``): the
    region is made there, the link points to the public one, and the API alone (no ``url``)
    annotates without links."""
    token = tmp_path / "token"
    token.write_text(TOKEN)
    public = "https://grafana.example.invalid/"
    for urls in ({"url": public, "api_url": grafana.url}, {"api_url": grafana.url}):
        settings = Settings.model_validate({"grafana": {**urls, "token_file": str(token)}})
        adapter = annotator(settings)
        assert adapter is not None
        try:
            made = await adapter.open_region(REGION)
            assert grafana.world.annotations[made].tags[-1] == "incident:inc-0001"
        finally:
            await adapter.aclose()
        link = settings.grafana.incident_dashboard(FAULT, None)
        if "url" in urls:
            assert link is not None and link.startswith(f"{public}d/pitcrew-incidents?")
        else:
            assert link is None


def test_the_incident_link_shows_the_incident_on_the_incidents_dashboard() -> None:
    assert Settings().grafana.incident_dashboard(FAULT, None) is None
    grafana = Settings.model_validate(
        {"grafana": {"url": "https://grafana.example/", "incidents_dashboard_uid": "ours"}}
    ).grafana
    start = int((FAULT - timedelta(minutes=30)).timestamp() * 1000)
    assert grafana.incident_dashboard(FAULT, None) == f"https://grafana.example/d/ours?from={start}&to=now"
    end = int((FAULT + timedelta(minutes=42)).timestamp() * 1000)
    closed = grafana.incident_dashboard(FAULT, FAULT + timedelta(minutes=12))
    assert closed == f"https://grafana.example/d/ours?from={start}&to={end}"
