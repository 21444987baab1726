"""The pod's life as the kubelet drives it, on the configuration the Deployment mounts:

- ``pitcrew serve`` with the observe overlay's mounted config starts, and the Deployment's own
  startup, liveness and readiness probe paths answer 200 on the container port;
- SIGTERM (what the kubelet sends first) ends it cleanly, exit 0, well before
  ``terminationGracePeriodSeconds`` would bring SIGKILL: a deadline the Deployment promises,
  not a performance figure.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from proving_ground.proc import free_port, stop_process
from tests.harness.proc import wait_until
from tests.packaging.manifests import REPO, container, mounted_sandbox, rendered


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def test_probes_answer_and_sigterm_ends_pitcrew_within_the_grace_period(tmp_path: Path) -> None:
    r = rendered("observe")
    deployment = r.one("Deployment", "pitcrew")
    c = container(deployment)
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    config = mounted_sandbox(r, tmp_path / "root")
    port = free_port()
    # The container listens on 0.0.0.0:<containerPort>; here, loopback on a free port.
    argv = [
        sys.executable,
        "-m",
        "bot.cli",
        *c["args"][:1],
        "-c",
        str(config),
        "--listen",
        f"127.0.0.1:{port}",
    ]
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", str(REPO))}
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        paths = {c[probe]["httpGet"]["path"] for probe in ("startupProbe", "livenessProbe", "readinessProbe")}
        assert paths == {"/healthz", "/readyz"}
        wait_until(lambda: _status(base + "/readyz") == 200, timeout=30, what="readiness")
        assert {path: _status(base + path) for path in sorted(paths)} == dict.fromkeys(sorted(paths), 200)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=grace)
        assert code == 0, (tmp_path / "serve.log").read_text()[-3000:]
    finally:
        stop_process(proc)
        log.close()
