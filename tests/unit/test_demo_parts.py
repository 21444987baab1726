"""The demo's own arithmetic and pre-flight, without starting the proving ground.

Cases: a missing program is named with the apt-get line that installs it; pitcrew's own share counts the time from opening the incident to its first step and each
gap between a step (or an approval) ending and the next starting, never the time inside steps or
the wait for a human; a port that another program holds is named before anything starts; a port held for pitcrew is
bound by pitcrew alone, across restarts; every
scenario ``scripts/demo`` offers exists, and each fault it injects is one the stand-in models; a
Slack Web API method pitcrew calls that the stand-in does not serve is reported (the demo fails on it).
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from proving_ground import proc
from proving_ground.__main__ import parser
from proving_ground.dcgm import FAULTS
from proving_ground.ground import preflight
from proving_ground.proc import SHARED_PORTS, free_port, free_ports, hold_port
from proving_ground.scenarios import SCENARIOS
from proving_ground.story import own_share


def _event(kind: str, second: float, step: str | None = None) -> dict[str, Any]:
    return {"kind": kind, "step": step, "at": f"2026-12-01T03:00:{second:06.3f}+00:00"}


@pytest.mark.parametrize(
    ("events", "own"),
    [
        ([], 0.0),
        ([_event("step_started", 10.5, "notify"), _event("step_finished", 11.0, "notify")], 0.5),
        (
            [
                _event("step_started", 10.1, "notify"),
                _event("step_finished", 10.2, "notify"),
                _event("step_started", 10.3, "slurm_down"),  # 0.1 s gap: ours
                _event("step_finished", 15.0, "slurm_down"),  # 4.7 s inside the step: Slurm's
                _event("step_started", 15.2, "cordon"),
            ],
            0.4,
        ),
        (
            [
                _event("step_finished", 10.2, "notify"),
                _event("approved", 40.0),  # 29.8 s waiting for a human: not ours
                _event("step_started", 40.3, "slurm_down"),
            ],
            0.3,
        ),
    ],
)
def test_own_share_is_the_gaps_between_steps(events: list[dict[str, Any]], own: float) -> None:
    incident = {"opened_at": "2026-12-01T03:00:10.000+00:00", "events": events}
    assert own_share(incident) == pytest.approx(own, abs=1e-6)


def test_a_taken_port_is_named_before_anything_starts() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        problems = preflight({"pitcrew": port})
    assert any(f"port {port} (pitcrew) is taken" in p for p in problems), problems


def test_a_missing_program_is_named_with_the_apt_command_that_installs_it() -> None:
    problems = preflight(
        programs={"prometheus": "prometheus", "pitcrew-no-such-daemon": "pitcrew-no-such-pkg"}
    )
    [missing] = [p for p in problems if p.startswith("missing programs")]
    assert "pitcrew-no-such-daemon" in missing and "prometheus," not in missing
    assert "apt-get install -y --no-install-recommends pitcrew-no-such-pkg" in missing


def test_every_scenario_the_cli_offers_exists_and_injects_a_modelled_fault() -> None:
    [option] = [a for a in parser()._actions if a.dest == "scenario"]
    assert set(option.choices or ()) == set(SCENARIOS)
    # the help says what each one does, and the README's scenario table lists each one
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    for name in SCENARIOS:
        assert name in (option.help or ""), name
        assert f"`--scenario {name}`" in readme, name
    assert all(s.fault.kind in FAULTS for s in SCENARIOS.values())


def test_a_missing_slurm_root_is_named_with_the_command_that_makes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROVING_GROUND_SLURM_ROOTS", str(tmp_path))
    [missing] = [p for p in preflight(slurm="24.11") if "root" in p and "Slurm 24.11" in p]
    assert f"no Slurm 24.11 root at {tmp_path / 'slurm-24.11'}" in missing
    assert "scripts/setup as root" in missing
    assert not [p for p in preflight(slurm="22.05") if "Slurm 22.05 root" in p]  # the machine's own
    [unknown] = [p for p in preflight(slurm="23.02") if "23.02" in p]
    assert "choose one of 22.05, 24.11" in unknown


def test_free_ports_are_distinct_and_below_the_ephemeral_range() -> None:
    """A cluster's ports are chosen together (slurmctld's must never equal a slurmd's), and outside
    the range the kernel takes client source ports from, so none is taken before its server binds."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = free_ports(200)
    assert len(set(ports)) == 200
    assert all(10000 <= p < low for p in ports)


def test_no_server_port_is_chosen_where_pitcrew_ports_are_held() -> None:
    """A server that binds with ``SO_REUSEADDR`` (PostgreSQL, slurmd, Prometheus) binds beside a
    shared hold and listens, and pitcrew's own bind then fails: so the ports ``free_ports`` hands
    out and the ports held for pitcrew never meet."""
    held = [hold_port(shared=True) for _ in range(20)]
    try:
        pitcrew = {int(sock.getsockname()[1]) for sock in held}
        server = _bind(next(iter(pitcrew)), reuse=True)  # the hazard: beside the hold
        assert server is not None
        server.close()
        assert all(port in SHARED_PORTS for port in pitcrew)
        assert not any(port in SHARED_PORTS for port in free_ports(500))
    finally:
        for sock in held:
            sock.close()


def _choosing_first(port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The next random port choice is ``port``; later ones are random again."""
    choices = iter([port])
    real = random.choice
    monkeypatch.setattr(random, "choice", lambda ports: next(choices, None) or real(ports))


def test_a_port_handed_out_is_not_handed_out_again_while_its_server_may_still_bind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Between ``free_ports`` and its server's bind the port is free: another process (a worker, the
    other CI shard) choosing it then would start a second server on it. A claim in ``CLAIMS`` keeps
    it out of every choice for ``CLAIM_SECONDS``."""
    first = free_port()
    _choosing_first(first, monkeypatch)
    assert free_port() != first
    os.utime(proc.CLAIMS / str(first), (0, time.time() - proc.CLAIM_SECONDS - 1))
    _choosing_first(first, monkeypatch)
    assert free_port() == first  # an old claim: its server bound long ago or never will
    os.utime(proc.CLAIMS / str(first), (0, time.time() - proc.CLAIM_SECONDS - 1))
    proc.renew_claims(first)  # its server stops, to start again on it (a Postgres restart)
    _choosing_first(first, monkeypatch)
    assert free_port() != first


def _bind(port: int, *, reuse: bool) -> socket.socket | None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if reuse:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        sock.close()
        return None
    return sock


def test_a_port_held_for_pitcrew_is_bound_by_pitcrew_alone() -> None:
    """pitcrew's port stays held while pitcrew binds it beside the hold (``SO_REUSEADDR``, asyncio's
    default), across a restart; a bind without the option (another hold, ``free_ports``) is refused
    all the while, and so is every bind while pitcrew listens."""
    held = hold_port(shared=True)
    port = held.getsockname()[1]
    try:
        assert _bind(port, reuse=False) is None  # nobody else's choice
        for _ in range(2):  # a start, then a restart on the same port
            server = _bind(port, reuse=True)
            assert server is not None
            server.listen()
            other = _bind(port, reuse=True)
            assert other is None  # a second listener: refused
            server.close()
        assert _bind(port, reuse=False) is None  # between a kill and a restart: still held
    finally:
        held.close()
    again = _bind(port, reuse=False)
    assert again is not None  # released
    again.close()


class _NoCluster:
    """The cluster half of a far side, doing nothing: only the Slack half is under test."""

    description = "no cluster"

    def start(self, workdir: Path, nodes: Any) -> None:
        pass

    def stop(self) -> None:
        pass

    def refused(self) -> list[str]:
        return []


def test_the_demo_reports_a_slack_method_slack_lacks(tmp_path: Path) -> None:
    from slack_sdk import WebClient
    from slack_sdk.errors import SlackApiError

    from proving_ground.slackside import SlackFarSide

    side = SlackFarSide(_NoCluster())  # type: ignore[arg-type]  # the cluster half is not used
    side.start(tmp_path, ["gpu-node-01"])
    try:
        token = (tmp_path / "slack" / "bot.token").read_text().strip()  # pitcrew's own bot token
        bot = WebClient(token=token, base_url=side._standin.base_url)
        bot.auth_test()  # served: nothing to report
        assert side.refused() == []
        with pytest.raises(SlackApiError):
            bot.api_call("pins.add", params={"channel": "C0GPUOPS"})
        assert side.refused() == [
            "Slack: pitcrew called pins.add, a Web API method the stand-in does not serve"
        ]
    finally:
        side.stop()


def test_a_process_gives_its_claims_up_when_it_exits() -> None:
    """A process's claims go when it exits (its servers are gone): the files no longer pile up in
    ``CLAIMS``. A claim another process made since on the same port (the first one's was old) is
    not given up with it."""
    child = (
        "import os, time\n"
        "from proving_ground import proc\n"
        "kept, taken = proc.free_port(), proc.free_port()\n"
        "path = proc.CLAIMS / str(taken)\n"
        # Taken over as another process takes a claim once it is old (``CLAIM_SECONDS`` later):
        "path.unlink()\n"
        "os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))\n"
        "later = time.time() + proc.CLAIM_SECONDS + 1\n"
        "os.utime(path, (later, later))\n"
        "print(kept, taken)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", child],
        cwd=Path(__file__).resolve().parents[2],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    kept, taken = out.split()
    assert not (proc.CLAIMS / kept).exists()
    assert (proc.CLAIMS / taken).exists()
    (proc.CLAIMS / taken).unlink()
