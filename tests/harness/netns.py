"""Private networks for partition tests: each replica in a network namespace of its own.

``two_sites`` (function) builds, with ``ip`` as root, two namespaces and two bridges in the test's
own namespace: one bridge for the store (PostgreSQL listens on its address), one for the far sides
(Slurm, the Kubernetes API emulator, the Slack stand-in listen on its address). Each namespace
joins each bridge by a veth pair of its own, so a replica's link to the store can be cut (``cut``:
``ip link set db0 down`` inside its namespace) while its link to the far sides stays up, and
restored (``restore``). Addresses are private (10.213.N.0/24 and 10.214.N.0/24, N from the pid,
or the next one no interface is on, so two runs on one machine do not collide); nothing listens
on a public interface. Everything is deleted at teardown, whatever happened. No ``ip``, not
root, or no namespaces: the tests skip, or fail under ``CI=true`` (``tests.harness.proc``).
"""

from __future__ import annotations

import fcntl
import itertools
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.harness.proc import require_binary, unavailable

__all__ = ["Site", "TwoSites", "two_sites"]

#: The namespace side's names of its two links.
DB_LINK, FAR_LINK = "db0", "far0"


def _ip(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *argv], capture_output=True, text=True, timeout=15, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(argv)}: {done.stderr.strip()}")
    return done


@dataclass(frozen=True)
class Site:
    """One replica's namespace: its name, its address on the far-side bridge (where it listens),
    and the argv prefix that runs a program inside it."""

    namespace: str
    address: str

    @property
    def prefix(self) -> tuple[str, ...]:
        return ("ip", "netns", "exec", self.namespace)

    def cut(self) -> None:
        """The link to the store goes down; the one to the far sides stays up."""
        _ip("-n", self.namespace, "link", "set", DB_LINK, "down")

    def restore(self) -> None:
        _ip("-n", self.namespace, "link", "set", DB_LINK, "up")

    def db_link_up(self) -> bool:
        shown = _ip("-n", self.namespace, "-br", "link", "show", DB_LINK).stdout
        return " UP " in f" {shown} "


@dataclass(frozen=True)
class TwoSites:
    """The store's network (``db_network``: this machine's address and prefix on it), the far
    sides' address, and the two replicas' sites."""

    db_network: str
    far_host: str
    sites: tuple[Site, Site]

    @property
    def db_host(self) -> str:
        return self.db_network.split("/")[0]


def _require() -> None:
    require_binary("ip", "iproute2")
    if os.geteuid() != 0:
        unavailable("network namespaces need root")


#: Held while a subnet is chosen and taken (``two_sites``): shared by every test process here.
SUBNETS_LOCK = Path("/tmp/pitcrew-netns-subnets.lock")
#: Counts this process's uses of ``two_sites`` (its names' tag).
_USES = itertools.count()


def _free_subnet(start: int) -> int:
    """The first N from ``start`` whose 10.213.N.0/24 and 10.214.N.0/24 no interface here is on:
    tests of both shards (``tests/e2e``, ``tests/integration``) make sites at once."""
    taken = _ip("-4", "-o", "addr", "show").stdout
    for offset in range(250):
        n = (start + offset) % 250
        if f" 10.213.{n}." not in taken and f" 10.214.{n}." not in taken:
            return n
    raise RuntimeError("every 10.213.N.0/24 is taken on this machine")


@pytest.fixture
def two_sites() -> Iterator[TwoSites]:
    _require()
    # This process's, and this use's of it: a namespace deleted by the last one goes away in the
    # background, and the veth ends outside with it (the next one of the same name: "File exists").
    tag = f"{os.getpid() % 10000}{next(_USES) % 100}"
    bridges = {"db": f"pcdb{tag}", "far": f"pcfar{tag}"}
    namespaces = [f"pitcrew{tag}-{i}" for i in (1, 2)]
    outsides: list[str] = []
    try:
        # One process at a time from the look for a free subnet to its addresses on the bridges:
        # two that picked the same one would both get it (an address may be on two interfaces),
        # and their packets would go to either.
        with SUBNETS_LOCK.open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            n = _free_subnet(os.getpid() % 250)
            prefix = {"db": f"10.213.{n}", "far": f"10.214.{n}"}
            for kind, bridge in bridges.items():
                _ip("link", "add", bridge, "type", "bridge")
                _ip("addr", "add", f"{prefix[kind]}.1/24", "dev", bridge)
                _ip("link", "set", bridge, "up")
        sites = []
        for index, namespace in enumerate(namespaces, start=1):
            try:
                _ip("netns", "add", namespace)
            except RuntimeError as exc:
                unavailable(f"cannot make a network namespace: {exc}")
            _ip("-n", namespace, "link", "set", "lo", "up")
            for kind, inside in (("db", DB_LINK), ("far", FAR_LINK)):
                outside = f"pc{tag}{kind[0]}{index}"
                _ip("link", "add", outside, "type", "veth", "peer", "name", inside, "netns", namespace)
                outsides.append(outside)
                _ip("link", "set", outside, "master", bridges[kind])
                _ip("link", "set", outside, "up")
                _ip("-n", namespace, "addr", "add", f"{prefix[kind]}.{10 + index}/24", "dev", inside)
                _ip("-n", namespace, "link", "set", inside, "up")
            sites.append(Site(namespace, f"{prefix['far']}.{10 + index}"))
        yield TwoSites(f"{prefix['db']}.1/24", f"{prefix['far']}.1", (sites[0], sites[1]))
    finally:
        for outside in outsides:  # each pair at once (a namespace's deletion takes them later)
            _ip("link", "del", outside, check=False)
        for namespace in namespaces:
            _ip("netns", "del", namespace, check=False)
        for bridge in bridges.values():
            _ip("link", "del", bridge, check=False)
