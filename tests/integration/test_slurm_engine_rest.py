"""slurmrestd 22.05 hides DOWN while the node's CPUs are still allocated; pitcrew must not believe it.

Seen in the engine tests (``tests/e2e/test_slurm_remediation.py``): right after ``scontrol update
State=DOWN`` of a node whose job is being killed, ``GET /slurm/v0.0.38/node/{name}`` answers
``"state": "mixed"`` with no DOWN flag, but already with the new reason, for 0.1 to 0.5 s (payload
below, captured then). scontrol shows ``DOWN`` at once. Cases, against a wire-level stand-in:

* that payload (a reason, no DOWN/DRAIN/FAIL): the REST backend asks scontrol and reports DOWN;
* a node in service (no reason) or DRAIN (flag present) is read from REST alone;
* the node list: a reason counts as DOWN only on 22.05 and only for a node shown busy (a RESUME
  keeps the last reason, so an idle node with one is in service; 24.11 shows DOWN itself); no node
  is read alone, and on 22.05 the nodes its list hides are asked for (``unlisted_nodes``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Collection, Mapping
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from bot.domain.jobs import SlurmNodeState
from bot.domain.ownership import is_pitcrew_reason
from bot.integrations.slurm import RestScheduler, ScontrolScheduler
from tests.conftest import FIXTURES

OPENAPI = json.loads((FIXTURES / "slurm" / "rest" / "openapi-v3.json").read_text())
REASON = "pitcrew: pc-00001 XID 79 gpu3"
# GET /slurm/v0.0.38/node/gpu-001 13 ms after DOWN (fields that do not matter here left out).
MIXED_WHILE_DOWN = {
    "name": "gpu-001",
    "state": "mixed",
    "state_flags": [],
    "reason": REASON,
    "reason_changed_at": 1795947659,
    "reason_set_by_user": "root",
    "alloc_cpus": 1,
    "idle_cpus": 1,
    "gres_used": "gpu:h100:0(IDX:N/A)",
}


class Scontrol(ScontrolScheduler):
    """What scontrol says about the node at the same moment."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []

    async def node(self, name: str) -> SlurmNodeState:
        self.asked.append(name)
        return SlurmNodeState(name, frozenset({"DOWN"}), REASON, "root")

    async def unlisted_nodes(self, listed: Collection[str]) -> list[SlurmNodeState]:
        """The search for nodes 22.05's lists hide (``ScontrolScheduler.unlisted_nodes``, tested
        against the real cluster): asked, none found."""
        self.asked.append("unlisted: " + ",".join(sorted(listed)))
        return []


@pytest.fixture
async def serve(tmp_path: Path) -> AsyncIterator[Any]:
    servers: list[TestServer] = []
    token = tmp_path / "token"
    token.write_text("SLURM_JWT=t\n")

    async def start(
        node: Mapping[str, Any], document: Mapping[str, Any] = OPENAPI, version: str = "v0.0.38"
    ) -> tuple[RestScheduler, Scontrol]:
        async def openapi(request: web.Request) -> web.Response:
            return web.json_response(document)

        async def get_node(request: web.Request) -> web.Response:
            return web.json_response({"nodes": [node], "errors": []})

        app = web.Application()
        app.router.add_get("/openapi/v3", openapi)
        app.router.add_get(f"/slurm/{version}/node/{{name}}", get_node)
        app.router.add_get(f"/slurm/{version}/nodes", get_node)
        app.router.add_get(f"/slurm/{version}/nodes/", get_node)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        fallback = Scontrol()
        url = str(server.make_url("/")).rstrip("/")
        return RestScheduler(url=url, user="root", token_file=token, fallback=fallback), fallback

    yield start
    for server in servers:
        await server.close()


async def test_a_just_downed_node_shown_mixed_is_read_through_scontrol(serve: Any) -> None:
    rest, scontrol = await serve(MIXED_WHILE_DOWN)
    try:
        node = await rest.node("gpu-001")
    finally:
        await rest.aclose()
    assert scontrol.asked == ["gpu-001"]
    assert node.down
    assert node.reason == REASON
    assert is_pitcrew_reason(node.reason)


@pytest.mark.parametrize(
    ("payload", "states"),
    [
        ({"name": "gpu-001", "state": "mixed", "state_flags": [], "reason": ""}, {"MIXED"}),
        ({"name": "gpu-001", "state": "idle", "state_flags": ["DRAIN"], "reason": REASON}, {"IDLE", "DRAIN"}),
    ],
)
async def test_unambiguous_states_come_from_rest_alone(
    serve: Any, payload: dict[str, Any], states: set[str]
) -> None:
    rest, scontrol = await serve(payload)
    try:
        node = await rest.node("gpu-001")
    finally:
        await rest.aclose()
    assert scontrol.asked == []
    assert node.states == states


STALE = "XID 48 test"  # an operator's reason, left on the node by the RESUME that put it back
V42 = json.loads((FIXTURES / "slurm" / "24.11" / "rest" / "openapi-v3.json").read_text())
IDLE_42 = {
    **json.loads((FIXTURES / "slurm" / "24.11" / "rest" / "v0.0.42" / "nodes-healthy.json").read_text())[
        "nodes"
    ][2],
    "reason": STALE,
}


@pytest.mark.parametrize(
    ("payload", "document", "version", "states"),
    [
        # 24.11 keeps a node's last reason after RESUME (the ``resumed`` capture): in service.
        (IDLE_42, V42, "v0.0.42", {"IDLE"}),
        (
            {"name": "gpu-001", "state": "idle", "state_flags": [], "reason": STALE},
            OPENAPI,
            "v0.0.38",
            {"IDLE"},
        ),
        # 22.05 shows a node just set DOWN "mixed" while its jobs are killed: its reason says DOWN.
        ({**MIXED_WHILE_DOWN, "reason": STALE}, OPENAPI, "v0.0.38", {"MIXED", "DOWN"}),
        (MIXED_WHILE_DOWN, OPENAPI, "v0.0.38", {"MIXED"}),  # pitcrew's own: its incident knows
    ],
    ids=[
        "24.11-resumed-with-a-reason",
        "22.05-idle-with-a-reason",
        "22.05-mixed-while-down",
        "22.05-pitcrew",
    ],
)
async def test_the_node_list_counts_a_reason_as_down_only_where_rest_hides_down(
    serve: Any, payload: dict[str, Any], document: dict[str, Any], version: str, states: set[str]
) -> None:
    rest, scontrol = await serve(payload, document, version)
    try:
        [node] = await rest.nodes()
    finally:
        await rest.aclose()
    # No node is read alone; 22.05's list also asks for the nodes it hides (powered-down CLOUD ones).
    assert scontrol.asked == (["unlisted: gpu-001"] if version == "v0.0.38" else [])
    assert node.states == states and node.reason == payload["reason"]
