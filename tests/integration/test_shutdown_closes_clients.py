"""The service's shutdown closes the connections its far sides opened.

Case: pitcrew's application with the REST Slurm backend against the wire-level slurmrestd
(``tests.harness.slurmrestd``: the real v0.0.38 OpenAPI document) reads a node, so the backend
holds an HTTP session; stopping the application closes that session (aiohttp would otherwise
warn "Unclosed client session" at exit and keep the socket open), and the scheduler can open a
fresh one after.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp.test_utils import TestServer

from bot.config import load_config
from bot.integrations.slurm import RestScheduler
from bot.runtime import build_app, build_ports
from tests.harness.slurmrestd import SECRET, V38_DOC, FakeSlurmrestd


async def test_stopping_the_service_closes_the_slurmrestd_session(tmp_path: Path) -> None:
    slurmrestd = FakeSlurmrestd(V38_DOC)
    far = TestServer(slurmrestd.app(), host="127.0.0.1")
    await far.start_server()
    (tmp_path / "jwt").write_text(f"SLURM_JWT={SECRET}\n")
    config = load_config(
        None,
        store={"path": str(tmp_path / "pitcrew.db")},
        integrations={"scheduler": "slurm", "cluster": "none"},
        slurm={
            "backend": "rest",
            "rest_url": str(far.make_url("/")).rstrip("/"),
            "rest_token_file": str(tmp_path / "jwt"),
        },
    )
    ports = build_ports(config)
    scheduler = ports.scheduler
    assert isinstance(scheduler, RestScheduler)
    service = TestServer(build_app(config, ports=ports), host="127.0.0.1")
    try:
        await service.start_server()
        assert (await scheduler.node("gpu-001")).name == "gpu-001"
        session = scheduler._session
        assert session is not None and not session.closed
        await service.close()  # the application's cleanup: what SIGTERM runs
        assert session.closed
        assert (await scheduler.node("gpu-001")).name == "gpu-001"  # a new session, a new connection
        assert len(set(slurmrestd.connections)) == 2
        await scheduler.aclose()
    finally:
        await service.close()
        await far.close()
