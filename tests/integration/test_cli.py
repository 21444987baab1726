"""The CLI and the configuration: the public interface scripts rely on.

Cases: ``plan --json`` shape for every fixture (one object per node, with node, faults,
playbook, mode, steps, reasons); human output; the breaker's line names the fleet size it
used and its source (configured, or unknown to a dry run); ``check-config`` exit codes and messages;
YAML + env overrides with ``__`` nesting; secrets read from files; ``catalog``.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from bot.cli import main
from bot.config import ConfigError, load_config, load_settings
from tests.conftest import FIXTURES

AM = FIXTURES / "alertmanager"
PLAYBOOK_OF = {
    "xid79-firing.json": {"gpu-node-02": "replace-node"},
    "xid79-repeat.json": {"gpu-node-02": "replace-node"},
    "xid79-firing-lowercase-hostname-label.json": {"gpu-node-02": "replace-node"},
    "two-faults-same-node.json": {"gpu-node-02": "replace-node"},
    "row-remap-failure-firing.json": {"gpu-node-01": "replace-node"},
    "exporter-down-firing.json": {"gpu-node-04": "notify-only"},
    "gpu-fallen-off-bus-firing.json": {"gpu-node-03": "replace-node"},
    "xid48-then-xid154-1-after-xid48.json": {"gpu-node-01": "reset-gpu"},
    "xid48-then-xid154-2-after-xid154.json": {"gpu-node-01": "reset-gpu"},
    "xid79-resolved.json": {"gpu-node-02": "none"},
}


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PITCREW_STORE__PATH", str(tmp_path / "none.db"))
    for name in ("PITCREW_MODE", "PITCREW_SERVER__LISTEN"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("name", sorted(PLAYBOOK_OF))
def test_plan_json(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(AM / name), "--json"]) == 0
    plans = json.loads(capsys.readouterr().out)
    assert {p["node"]: p["playbook"] for p in plans} == PLAYBOOK_OF[name]
    for p in plans:
        assert set(p) >= {"node", "faults", "playbook", "mode", "steps", "reasons"}
        assert p["mode"] == "observe"
        for fault in p["faults"]:
            assert set(fault) >= {"xid", "gpu", "bucket", "class"}
        assert p["reasons"]


def test_plan_json_details_for_xid79(capsys: pytest.CaptureFixture[str]) -> None:
    main(["plan", str(AM / "xid79-firing.json"), "--json"])
    [p] = json.loads(capsys.readouterr().out)
    assert p["faults"] == [
        {**p["faults"][0], "xid": 79, "gpu": "3", "bucket": "RESTART_BM", "class": "gpu-lost"}
    ]
    assert p["steps"][0] == "notify" and p["steps"][-1] == "close"
    assert {g["guard"] for g in p["guards"]} >= {"pause", "breaker", "cooldown", "attempts"}


def test_plan_human_output_explains_guards(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PITCREW_MODE", "auto")
    main(["plan", str(AM / "two-faults-same-node.json")])
    out = capsys.readouterr().out
    assert "node gpu-node-02: replace-node (mode auto)" in out
    assert "XID 79 GPU 3" in out and "ecc-dbe GPU 5" in out
    assert "guard  ok breaker:" in out and "guard  ok cooldown:" in out


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({}, "fleet size unknown (not read: a dry run contacts no far side), so 1 node at a time"),
        (
            {"PITCREW_GUARDS__BREAKER__FLEET_SIZE": "40"},
            "2.5% of the fleet of 40 nodes from guards.breaker.fleet_size (share limit 2 nodes)",
        ),
    ],
    ids=["unknown", "configured"],
)
def test_plan_names_the_fleet_the_breaker_used(
    env: dict[str, str], words: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PITCREW_MODE", "auto")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    main(["plan", str(AM / "xid79-firing.json")])
    [breaker] = [ln for ln in capsys.readouterr().out.splitlines() if "guard  ok breaker:" in ln]
    assert words in breaker, breaker


@pytest.mark.parametrize(
    ("pools", "words"),
    [
        (None, ["no pool is configured: a job that needs every node of its partition waits for the repair"]),
        (
            [
                {"name": "spares", "reservation": "spares", "min_idle": 1},
                {
                    "name": "inference",
                    "kind": "lender",
                    "selector": "pitcrew.dev/pool=inference",
                    "join_labels": {"slinky.slurm.net/nodeset": "gpu"},
                    "max_lend": 0.25,
                },
            ],
            [
                "1. spare pool spares (Slurm reservation spares): min_idle 1",
                "2. lender pool inference (nodes pitcrew.dev/pool=inference): min_idle 0, max_lend 25% of "
                "the pool, its pods evicted within 10m",
            ],
        ),
    ],
    ids=["no-pool", "pools"],
)
def test_plan_says_where_a_stalled_job_would_take_a_node_from(
    pools: list[dict[str, object]] | None,
    words: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PITCREW_MODE", "auto")
    if pools is not None:
        monkeypatch.setenv("PITCREW_CAPACITY__POOLS", json.dumps(pools))
    main(["plan", str(AM / "xid79-firing.json")])
    spare = [ln.strip() for ln in capsys.readouterr().out.splitlines() if ln.startswith("  spare  ")]
    assert [ln.removeprefix("spare  ") for ln in spare[: len(words)]] == words
    assert "pending for lack of nodes" in spare[-1] or pools is None
    main(["plan", str(AM / "xid79-firing.json"), "--json"])
    [plan] = json.loads(capsys.readouterr().out)
    assert plan["capacity"][: len(words)] == words


def test_plan_live_says_why_it_read_no_pool_where_no_far_side_is_configured(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--live`` reads a pool only through a real far side: the dry-run journal has none to read."""
    monkeypatch.setenv("PITCREW_MODE", "auto")
    pools = [
        {"name": "spares", "kind": "spare", "reservation": "spares"},
        {
            "name": "inference",
            "kind": "lender",
            "selector": "pitcrew.dev/pool=inference",
            "join_labels": {"slinky.slurm.net/nodeset": "gpu"},
        },
    ]
    monkeypatch.setenv("PITCREW_CAPACITY__POOLS", json.dumps(pools))
    assert main(["plan", str(AM / "xid79-firing.json"), "--live", "--json"]) == 0
    [plan] = json.loads(capsys.readouterr().out)
    assert plan["capacity_choice"] is None
    assert plan["capacity"][-1] == (
        "now: not read (pool spares needs integrations.scheduler: slurm; pool inference needs "
        "integrations.cluster: kubernetes): the take is decided when the job is found pending"
    )
    assert main(["plan", str(AM / "xid79-firing.json")]) == 0  # without --live: nothing said of now
    assert "now:" not in capsys.readouterr().out


@pytest.mark.parametrize("far_side", ["refuses", "silent"])
def test_plan_live_says_the_pools_could_not_be_read_when_slurm_does_not_answer(
    far_side: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A slurmrestd that refuses the connection, or accepts it and never answers (within
    ``slurm.request_timeout``): ``--live`` says the pools could not be read and why, exits 0, and the
    plan is still printed (what the take would do is decided when the job is found pending)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        if far_side == "silent":
            listener.listen()
        else:
            listener.close()
        token = tmp_path / "slurm-token"
        token.write_text("not-a-real-token\n")
        config = tmp_path / "pitcrew.yaml"
        config.write_text(
            json.dumps(
                {
                    "mode": "auto",
                    "integrations": {"scheduler": "slurm"},
                    "slurm": {
                        "backend": "rest",
                        "rest_url": f"http://127.0.0.1:{port}",
                        "rest_token_file": str(token),
                        "request_timeout": 0.5,
                    },
                    "store": {"path": str(tmp_path / "none.db")},
                    "capacity": {"pools": [{"name": "spares", "kind": "spare", "reservation": "spares"}]},
                }
            )
        )
        assert main(["plan", str(AM / "xid79-firing.json"), "--live", "--json", "-c", str(config)]) == 0
    [plan] = json.loads(capsys.readouterr().out)
    assert plan["capacity_choice"] is None
    why = {
        "refuses": "slurmrestd unreachable (ClientConnectorError)",
        "silent": "slurmrestd gave no answer in time",
    }
    assert plan["capacity"][-1] == (
        f"now: the pools could not be read (openapi: {why[far_side]}): the take is decided when the job is found pending"
    )
    assert plan["playbook"] == "replace-node"


def test_plan_rejects_a_bad_payload(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": "4"}')
    assert main(["plan", str(bad)]) == 1
    assert "not an Alertmanager v4 webhook" in capsys.readouterr().err


def test_check_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("mode: observe\nserver: {listen: 127.0.0.1:9999}\n")
    assert main(["check-config", "--config", str(good)]) == 0
    assert "configuration OK" in capsys.readouterr().out
    cases = {
        "mode: yolo\n": "mode",
        "server: {listen: nowhere}\n": "server.listen",
        "servr: {}\n": "unknown key",
        "mode: approve\n": "approvals.approvers",
        "server: {listen: '0.0.0.0:9095'}\n": "without authentication",
        "server: {auth: {bearer_token_file: /nonexistent/token}}\n": "cannot read /nonexistent/token",
        "catalog: {overrides: {'79': {playbook: nonsense}}}\n": "playbook 'nonsense'",
        "playbooks: {x: {steps: [notify]}}\n": "ends with 'close'",
        "guards: {breaker: {max_fraction: 2}}\n": "max_fraction",
        "escalation: {window: soon}\n": "not a duration",
        "capacity: {pools: [{name: s, selector: p=s, join_command: [j, '{host}'], leave_command: [l]}]}\n": (
            "unknown placeholder {host}"
        ),
        "playbooks: {reset-gpu: {fault_returns_within: 10m}}\n": "fault_returns_within needs a next rung",
        "[unclosed\n": "not valid YAML",
    }
    for text, says in cases.items():
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        assert main(["check-config", "--config", str(bad)]) == 1, text
        assert says in capsys.readouterr().err, text
    assert main(["check-config", "--config", str(tmp_path / "missing.yaml")]) == 1


def test_env_overrides_yaml_with_nesting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("mode: approve\napprovals: {approvers: [alice]}\nserver: {listen: 127.0.0.1:1000}\n")
    token = tmp_path / "token"
    token.write_text("abc\n")
    monkeypatch.setenv("PITCREW_MODE", "auto")
    monkeypatch.setenv("PITCREW_SERVER__LISTEN", "127.0.0.1:2000")
    monkeypatch.setenv("PITCREW_SERVER__AUTH__BEARER_TOKEN_FILE", str(token))
    monkeypatch.setenv("PITCREW_STORE__PATH", str(tmp_path / "x.db"))
    config = load_config(path)
    assert config.settings.mode.value == "auto"
    assert config.settings.server.listen == "127.0.0.1:2000"
    assert config.settings.server.auth.bearer_token_file == token
    assert config.settings.store.path == tmp_path / "x.db"
    assert config.policy.approvals.approvers == ("alice",)
    assert load_settings(path, server={"listen": "127.0.0.1:3000"}).server.listen == "127.0.0.1:3000"


def test_defaults_are_safe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PITCREW_STORE__PATH")
    config = load_config()
    assert config.settings.mode.value == "observe"
    assert config.settings.server.loopback_only
    assert config.settings.store.path.name == "pitcrew.db"


def test_empty_secret_file_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        load_config(None, server={"auth": {"bearer_token_file": str(tmp_path / "empty")}})


def test_catalog_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    by_xid = {e["xid"]: e for e in data["entries"] if e["xid"] is not None}
    assert by_xid[79]["playbook"] == "replace-node"
    assert by_xid[13]["playbook"] == "notify-only"
    assert main(["catalog"]) == 0
    assert "XID 79" in capsys.readouterr().out


def test_the_catalog_says_where_pitcrew_differs_from_nvidias_bucket_and_why(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["catalog", "--json"]) == 0
    by_xid = {e["xid"]: e for e in json.loads(capsys.readouterr().out)["entries"] if e["xid"] is not None}
    assert by_xid[79]["differs"].startswith("NVIDIA's RESTART_BM asks for reboot-node: the node goes out")
    assert 'catalog: {overrides: {"79": {playbook: reboot-then-replace}}}' in by_xid[79]["differs"]
    assert by_xid[151]["differs"].startswith("NVIDIA's RESTART_VM asks for reboot-node")
    assert by_xid[64]["differs"].startswith("NVIDIA's RESET_GPU asks for reset-gpu: ")
    assert by_xid[48]["differs"] is None  # reset-gpu, as NVIDIA's bucket asks
    assert by_xid[13]["differs"] is None  # RESTART_APP: notify-only, the application restarts
    assert main(["catalog"]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("XID 79 "))
    assert lines[at + 1].strip().startswith("differs: NVIDIA's RESTART_BM asks for reboot-node")


def test_the_one_setting_the_catalog_names_makes_an_xid_reboot_first_and_climb_to_replace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The override ``pitcrew catalog`` names under XID 79, copied as it is into a configuration, is
    all it takes: the reboot first, replace-node as the next rung, the fault's return watched."""
    assert main(["catalog", "--json"]) == 0
    differs = {e["xid"]: e for e in json.loads(capsys.readouterr().out)["entries"]}[79]["differs"]
    setting = differs.split("set the one override ", 1)[1].split(": it reboots", 1)[0]
    config = tmp_path / "pitcrew.yaml"
    config.write_text(setting + "\n")
    loaded = load_config(config)
    assert loaded.catalog.xid_playbook(79) == "reboot-then-replace"
    playbook = loaded.playbooks.get("reboot-then-replace")
    assert playbook.next == "replace-node"
    assert playbook.fault_returns_within is not None and playbook.fault_returns_within.total_seconds() == 1800
    assert "reboot" in [s.step for s in playbook.steps]
    assert main(["catalog", "--json", "-c", str(config)]) == 0
    entry = {e["xid"]: e for e in json.loads(capsys.readouterr().out)["entries"]}[79]
    assert (entry["playbook"], entry["differs"]) == ("reboot-then-replace", None)  # what NVIDIA asks, first
    monkeypatch.setenv("PITCREW_MODE", "auto")
    assert main(["plan", str(AM / "xid79-firing.json"), "--json", "-c", str(config)]) == 0
    [plan] = json.loads(capsys.readouterr().out)
    assert plan["playbook"] == "reboot-then-replace" and "reboot" in plan["steps"]


def test_console_script_entry_point() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bot.cli", "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.startswith("pitcrew ")


def test_plan_reads_guard_state_from_the_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio
    from datetime import UTC, datetime

    from bot.store.sqlite import SqliteStore

    db = tmp_path / "store.db"
    monkeypatch.setenv("PITCREW_STORE__PATH", str(db))
    monkeypatch.setenv("PITCREW_MODE", "auto")

    async def trip() -> None:
        store = SqliteStore(db)
        await store.open()
        now = datetime.now(UTC)
        await store.set_switch(
            "breaker", {"open": True, "opened_at": now.isoformat(), "reason": "storm"}, "pitcrew", now
        )
        await store.set_switch("pause", {"reason": "maintenance"}, "alice", now)
        await store.close()

    asyncio.run(trip())
    assert main(["plan", str(AM / "xid79-firing.json")]) == 0
    out = capsys.readouterr().out
    assert "guard  NO pause: pitcrew is paused by alice" in out
    assert "guard  NO breaker: circuit breaker is open" in out and "(storm)" in out
