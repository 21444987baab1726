"""pitcrew itself as a real subprocess on loopback, in front of a simulated far side or not.

Used wherever a test must cross a process boundary: kill -9 and restart, hypothesis bodies
over real HTTP, the crash-safety run, the detection path. By default it runs
the real ``python -m bot.cli serve`` and ``journal`` is pitcrew's own dry-run journal; given
``simulator=MODULE`` (the tests' ``tests.simulator.serve``, which the proving ground never
imports) it runs ``python -m MODULE`` with a world file (``world={"inventory": ..., "latency":
"200ms"}``) and ``journal`` is the simulator's journal. Real
systems named in ``config`` (``integrations.scheduler: slurm``) stay real either way.
``host``: the address it listens on (loopback unless it runs in a test's network namespace,
``prefix`` then being ``ip netns exec NAME``, which execs it: its pid is pitcrew's).
``Pitcrew.kill()`` is SIGKILL; ``stop()`` is SIGTERM (graceful). The tests' fixture
(``tests.harness.pitcrew.pitcrew_factory``) stops every process it built. Incidents are read with the read token (``server.auth.read_token_file``),
and ``incident()`` follows the pages of its alerts and events to return them all.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
import weakref
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Self

import aiohttp
import yaml

from bot.store.base import PAGE_MAX
from proving_ground.assets import REPO
from proving_ground.proc import DemoError, hold_port, stop_process, tail, wait_until

#: Calls that change a node, a pod or a job (the journal's ``op``): what must never happen twice.
DESTRUCTIVE_OPS = (
    "slurm_down",
    "slurm_drain",
    "cordon",
    "evict",
    "delete_pod",
    "replace",
    "reboot",
    "reset_gpu",
)

#: How long ``Pitcrew.start`` waits for a started pitcrew to answer (seconds). A start takes a
#: second or two alone (importing its integrations is most of it), but on a machine four to five
#: times slower than a usual core, under the test suite's six workers, four starts of a whole run
#: took over 20 s (the limit before), one 10 s from its store's migration to its listener; a
#: pitcrew that exits meanwhile fails the wait at once, so only a start that hangs waits it out.
START_TIMEOUT = 60.0


class Pitcrew:
    def __init__(
        self,
        workdir: Path,
        *,
        config: Mapping[str, Any] | None = None,
        world: Mapping[str, Any] | None = None,
        simulator: str | None = None,
        env: Mapping[str, str] | None = None,
        token: str = "test-webhook-token",
        admin_token: str = "test-admin-token",
        read_token: str = "test-read-token",
        port: int = 0,
        host: str = "127.0.0.1",
        prefix: Sequence[str] = (),
    ) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        #: The port chosen here stays held (``hold_port(shared=True)``) for as long as this object
        #: lives, or until ``release``: pitcrew binds it beside the hold at each start, and no other
        #: server takes it between a choice and a start, or a kill and a restart.
        self._held: socket.socket | None = None
        if not port:
            self._held = hold_port(shared=True)
            weakref.finalize(self, self._held.close)
            port = int(self._held.getsockname()[1])
        self.port = port
        self.url = f"http://{host}:{self.port}"
        self.token, self.admin_token, self.read_token = token, admin_token, read_token
        (workdir / "webhook.token").write_text(token + "\n")
        (workdir / "admin.token").write_text(admin_token + "\n")
        (workdir / "read.token").write_text(read_token + "\n")
        simulated = simulator is not None
        if world is not None and not simulated:
            raise ValueError("a world is for the simulated far side; pitcrew serve has none")
        self.store = workdir / "pitcrew.db"
        self.journal = workdir / ("simulated-far-side.jsonl" if simulated else "dry-run-journal.jsonl")
        settings: dict[str, Any] = {
            "server": {
                "listen": f"{host}:{self.port}",
                "auth": {
                    "bearer_token_file": str(workdir / "webhook.token"),
                    "admin_token_file": str(workdir / "admin.token"),
                    "read_token_file": str(workdir / "read.token"),
                },
            },
            "store": {"path": str(self.store)},
            "integrations": {"journal_path": str(workdir / "dry-run-journal.jsonl")},
            "engine": {"poll_interval": "0.2s", "retry_backoff": "0.05s", "retry_backoff_max": "0.5s"},
            "log": {"level": "INFO", "format": "json"},
        }
        _merge(settings, dict(config or {}))
        self.config_path = workdir / "pitcrew.yaml"
        self.config_path.write_text(yaml.safe_dump(settings))
        self.argv = [sys.executable, "-m", "bot.cli", "serve", "--config", str(self.config_path)]
        if simulator is not None:
            self.world_path = workdir / "world.yaml"
            world_file = {"journal": str(self.journal), **{k: _plain(v) for k, v in (world or {}).items()}}
            self.world_path.write_text(yaml.safe_dump(world_file))
            self.argv = [sys.executable, "-m", simulator, "--config", str(self.config_path)]
            self.argv += ["--world", str(self.world_path)]
        self.argv = [*prefix, *self.argv]
        self.env = {**os.environ, **(env or {})}
        self.log = workdir / "pitcrew.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self, timeout: float = START_TIMEOUT, *, ready: bool = True) -> Self:
        """Start and wait until ``/readyz`` answers 200 (``ready=False``: until ``/healthz`` does,
        for a pitcrew that is meant to start not ready). A pitcrew that exits meanwhile fails the
        wait at once (``_healthy``)."""
        self.starts += 1
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,  # a terminal's Ctrl-C reaches whoever started it, who stops it
                cwd=REPO if REPO.is_dir() else None,
            )
        path = "/readyz" if ready else "/healthz"
        wait_until(
            lambda: self._healthy(path), timeout=timeout, what=f"{path} 200 on {self.url}\n{tail(self.log)}"
        )
        return self

    def _healthy(self, path: str) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise DemoError(f"pitcrew exited with {self.process.returncode}:\n{tail(self.log)}")
        try:
            with urllib.request.urlopen(f"{self.url}{path}", timeout=1) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process)
            self.process = None

    def release(self) -> None:
        """Stop holding the port (once stopped for good): another server may take it then."""
        if self._held is not None:
            self._held.close()
            self._held = None

    def kill(self) -> None:
        """SIGKILL: no cleanup, no flush, exactly what a node crash or OOM kill does."""
        if self.process is not None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)
            self.process = None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    # --------------------------------------------------------------- HTTP
    def request(
        self, method: str, path: str, body: bytes | None = None, headers: Mapping[str, str] | None = None
    ) -> tuple[int, bytes]:
        request = urllib.request.Request(
            self.url + path, data=body, method=method, headers=dict(headers or {})
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    def post_alerts(self, body: bytes, token: str | None = None) -> tuple[int, dict[str, Any]]:
        status, raw = self.request(
            "POST", "/api/v1/alerts", body, {"Authorization": f"Bearer {token or self.token}"}
        )
        return status, json.loads(raw or b"{}")

    def post_many(self, bodies: list[bytes], concurrency: int = 32) -> list[tuple[int, dict[str, Any]]]:
        """Deliver many bodies at once, as Alertmanager does for many groups (one connection pool)."""

        async def run() -> list[tuple[int, dict[str, Any]]]:
            headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
            limit = asyncio.Semaphore(concurrency)
            async with aiohttp.ClientSession(headers=headers) as session:

                async def one(body: bytes) -> tuple[int, dict[str, Any]]:
                    async with limit, session.post(f"{self.url}/api/v1/alerts", data=body) as response:
                        return response.status, await response.json()

                return list(await asyncio.gather(*(one(b) for b in bodies)))

        return asyncio.run(run())

    def command(self, path: str, actor: str, **extra: Any) -> tuple[int, dict[str, Any]]:
        status, raw = self.request(
            "POST",
            path,
            json.dumps({"actor": actor, **extra}).encode(),
            {"Authorization": f"Bearer {self.admin_token}", "Content-Type": "application/json"},
        )
        return status, json.loads(raw or b"{}")

    def read(self, path: str) -> tuple[int, bytes]:
        """GET with the read token, as a script reading incidents does."""
        return self.request("GET", path, headers={"Authorization": f"Bearer {self.read_token}"})

    def incidents(self, node: str | None = None) -> list[dict[str, Any]]:
        status, raw = self.read("/api/v1/incidents?limit=1000")
        assert status == 200, raw
        return [i for i in json.loads(raw)["incidents"] if node is None or i["node"] == node]

    def incident(self, incident_id: str) -> dict[str, Any]:
        """The incident with every one of its alerts and events (all their pages)."""
        page = f"alerts_limit={PAGE_MAX}&events_limit={PAGE_MAX}"
        status, raw = self.read(f"/api/v1/incidents/{incident_id}?{page}")
        assert status == 200, raw
        found = dict(json.loads(raw))
        for what in ("alerts", "events"):
            while found[f"{what}_next"] is not None:
                status, raw = self.read(
                    f"/api/v1/incidents/{incident_id}?{what}_limit={PAGE_MAX}&{what}_after={found[f'{what}_next']}"
                )
                assert status == 200, raw
                page = json.loads(raw)
                found[what] += page[what]
                found[f"{what}_next"] = page[f"{what}_next"]
        return found

    def wait_incident(self, incident_id: str, *states: str, timeout: float = 30.0) -> dict[str, Any]:
        found: dict[str, Any] = {}

        def reached() -> bool:
            found.update(self.incident(incident_id))
            return found["state"] in states

        wait_until(
            reached, timeout=timeout, interval=0.1, what=f"{incident_id} in {states}: {found.get('state')}"
        )
        return found

    def wait_call(self, op: str, target: str, timeout: float = 30.0) -> None:
        """Until the far side's journal shows ``op`` on ``target`` (a node, pod or job)."""
        wait_until(
            lambda: (op, target) in destructive_calls(self.journal_records()),
            timeout=timeout,
            interval=0.01,
            what=f"{op} on {target} to reach the far side",
        )

    def wait_event(
        self,
        incident_id: str,
        kind: str,
        step: str | None = None,
        timeout: float = 30.0,
        interval: float = 0.05,
    ) -> dict[str, Any]:
        """Until the incident's timeline has an event of ``kind`` (for ``step``, if given); the first one.

        Each look reads the whole incident (every page of its alerts and events) from pitcrew's
        read API: at 10 ms a minute's wait cost both processes seconds of CPU. A test that must act
        the moment an event is written (a kill before the next call) asks for a shorter ``interval``."""
        found: list[dict[str, Any]] = []

        def seen() -> bool:
            found[:] = [
                e
                for e in self.incident(incident_id)["events"]
                if e["kind"] == kind and (step is None or e["step"] == step)
            ]
            return bool(found)

        wait_until(seen, timeout=timeout, interval=interval, what=f"{kind} {step or ''} in {incident_id}")
        return found[0]

    def journal_records(self) -> list[dict[str, Any]]:
        if not self.journal.exists():
            return []
        return [json.loads(line) for line in self.journal.read_text().splitlines() if line.strip()]


def _plain(value: Any) -> Any:
    return str(value) if isinstance(value, Path) else value


def _merge(into: dict[str, Any], extra: dict[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def destructive_calls(records: list[dict[str, Any]]) -> Counter[tuple[str, str]]:
    """How many times each destructive call reached the far side, by (op, target)."""
    return Counter(
        (r["op"], r.get("pod") or r.get("node") or r.get("job_id") or "?")
        for r in records
        if r.get("op") in DESTRUCTIVE_OPS or r.get("op") in {"slurm_resume", "uncordon", "requeue"}
    )


def notices(records: list[dict[str, Any]], kind: str | None = None) -> list[dict[str, Any]]:
    """The notices in a journal (the simulated notifier's or the dry-run journal's), of one kind."""
    return [r for r in records if r.get("op") == "notice" and (kind is None or r.get("kind") == kind)]
