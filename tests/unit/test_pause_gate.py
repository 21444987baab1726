"""Every method of the ports that steps reach the far sides through is placed: it changes a far side
(held while paused, refused once deposed) or it only reads. A new port method that is neither fails
here, so a write can never slip past the kill switch and the fence by being forgotten."""

from __future__ import annotations

import inspect

import pytest

from bot.engine.pause import READS, WRITES
from bot.engine.ports import Cluster, Lending, NodeValidator, Reservations, Scheduler

PORTS = {"scheduler": (Scheduler, Reservations), "cluster": (Cluster, Lending, NodeValidator)}


def methods(protocols: tuple[type, ...]) -> set[str]:
    return {
        name
        for protocol in protocols
        for name, member in vars(protocol).items()
        if inspect.iscoroutinefunction(member) and not name.startswith("_")
    }


@pytest.mark.parametrize("port", sorted(PORTS))
def test_every_port_method_is_a_write_or_a_read(port: str) -> None:
    declared = methods(PORTS[port])
    assert not WRITES[port] & READS[port], "a method is both a write and a read"
    assert declared - WRITES[port] - READS[port] == set(), "port methods neither a write nor a read"
    assert (WRITES[port] | READS[port]) - declared == set(), "placed methods no port declares"


def test_the_writes_of_spares_are_gated() -> None:
    assert {"set_reservation_nodes"} <= WRITES["scheduler"]
    assert {"lend", "lend_back", "keep_lent", "set_labels"} <= WRITES["cluster"]
