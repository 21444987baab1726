"""The Slurm harness's slurmrestd is the server on its port, or the harness says so.

A CI run found pitcrew's every REST call refused with a reset ("slurmrestd unreachable
(ClientOSError)"): the port chosen for slurmrestd was taken before it started by a server that
reads a length and hangs up, as Slurm's own daemons do, and the harness took any connection for
slurmrestd. Case: with such a server on the port, starting slurmrestd moves it to another port,
where an authenticated request answers. (The harness used to fail here when slurmrestd exited at
once, and passed the squatter for slurmrestd when its exit came later, as on a busy machine.)
"""

from __future__ import annotations

import json
import socket
import threading
import urllib.request
from collections.abc import Iterator

import pytest

from proving_ground.slurm import SlurmCluster

pytestmark = pytest.mark.slow


class Squatter:
    """A listener that reads four bytes of each connection and hangs up (a Slurm daemon's answer
    to HTTP); what it read is kept."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # slurmrestd's port: TIME_WAIT
        self.seen: list[bytes] = []

    def listen(self, port: int) -> None:
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(8)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                self.seen.append(conn.recv(4))


@pytest.fixture
def squatter() -> Iterator[Squatter]:
    squatter = Squatter()
    try:
        yield squatter
    finally:
        squatter.sock.close()


def test_slurmrestd_moves_off_a_port_another_server_took(slurm: SlurmCluster, squatter: Squatter) -> None:
    taken = slurm.rest_port
    slurm._terminate("slurmrestd")
    squatter.listen(taken)

    slurm.start_rest()

    assert slurm.rest_port != taken
    token = slurm.token_file.read_text().strip()
    # The newest data parser each serves (26.05 dropped v0.0.40 and v0.0.41).
    version = {"22.05": "v0.0.38", "24.11": "v0.0.41", "26.05": "v0.0.45"}[slurm.version]
    request = urllib.request.Request(
        f"{slurm.rest_url}/slurm/{version}/ping",
        headers={"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": token},
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.status == 200 and "meta" in json.loads(resp.read())
