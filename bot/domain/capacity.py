"""Which node a stalled gang job may take while its failed node is repaired — or why none.

A job that fills its partition cannot restart until a node comes back. pitcrew can lend it
one from a **pool**: first a warm spare pool, then lender pools (inference nodes), in the
configured order. This module is the pure choice: it sees the failed node, the pools, each
pool's member nodes as the far side describes them, and every node already taken and not
given back (by an open incident, or an ended one that still holds it), and says which node to
take and why, or, when none qualifies, which guard stopped each candidate. No I/O, no clock;
the ``capacity`` step (``bot.engine.steps.capacity``) gathers the facts and acts on the answer.

Guards, each named in the answer where it refused a node:

- ``min_idle`` — a pool keeps at least this many idle members after the take;
- ``max_lend`` — a pool lends at most this many nodes (a count, or a fraction of its size);
- ``taken`` — a node another incident has taken (or is taking) is never taken twice;
- ``open_incident`` — a node with an open incident of its own;
- ``opt_out`` — a node carrying the opt-out label;
- ``gpu_type`` / ``gpu_count`` — a node whose GPUs differ from the failed node's (where both
  sides say; a side that does not say does not refuse);
- ``busy`` — a node that is not idle and in service.

Among the nodes that pass, one in the failed node's topology block (rack, NVLink domain,
network leaf: whatever label the site names) is preferred, then the lowest name, so the
choice is the same on every run.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

PoolKind = Literal["spare", "lender"]
Guard = Literal["min_idle", "max_lend", "taken", "open_incident", "opt_out", "gpu_type", "gpu_count", "busy"]


@dataclass(frozen=True, slots=True)
class Pool:
    """One place to take a node from (``capacity.pools`` in the configuration, in order)."""

    name: str
    kind: PoolKind
    #: Idle members the pool keeps after a take.
    min_idle: int = 0
    #: Nodes the pool lends at most: a count (>= 1) or a fraction of its size (< 1); ``None``: no cap.
    max_lend: float | None = None

    def lend_cap(self, size: int) -> int | None:
        """``max_lend`` as a node count for a pool of ``size`` nodes (a fraction rounds down)."""
        if self.max_lend is None:
            return None
        if self.max_lend < 1:
            return int(self.max_lend * size)
        return int(self.max_lend)


@dataclass(frozen=True, slots=True)
class Candidate:
    """One member of a pool as the far side describes it now."""

    name: str
    #: Idle and in service: nothing runs there and it may take a job.
    idle: bool = True
    gpu_type: str | None = None
    gpus: int | None = None
    topology: str | None = None
    opt_out: bool = False
    open_incident: bool = False


@dataclass(frozen=True, slots=True)
class Taken:
    """A node an incident has taken (or persisted its intent to take) from ``pool`` and not given
    back: an open incident's, or an ended one's still out (``capacity.claimants``)."""

    node: str
    pool: str
    incident: str


@dataclass(frozen=True, slots=True)
class Need:
    """The failed node the job lost, and the incident that asks."""

    incident: str
    node: str
    gpu_type: str | None = None
    gpus: int | None = None
    topology: str | None = None


@dataclass(frozen=True, slots=True)
class Refusal:
    node: str
    pool: str
    guard: Guard
    detail: str


@dataclass(frozen=True, slots=True)
class Choice:
    """The node to take (``node``/``pool`` set) or none, with every refusal that led there."""

    node: str | None = None
    pool: str | None = None
    why: str = ""
    refused: tuple[Refusal, ...] = ()

    @property
    def guards(self) -> tuple[Guard, ...]:
        """The guards that refused something, each once, in the order met."""
        return tuple(dict.fromkeys(r.guard for r in self.refused))


@dataclass(frozen=True, slots=True)
class PoolView:
    """One pool and its members now (a node already lent out is no longer a member)."""

    pool: Pool
    members: Sequence[Candidate] = field(default_factory=tuple)


def choose(need: Need, pools: Sequence[PoolView], taken: Iterable[Taken]) -> Choice:
    """The node ``need`` may take from ``pools`` (tried in order), or none and why."""
    taken = tuple(taken)
    by_node = {t.node: t for t in taken if t.incident != need.incident}
    refused: list[Refusal] = []
    for view in pools:
        pool = view.pool
        lent = sum(1 for t in taken if t.pool == pool.name)
        members = [m for m in view.members if m.name != need.node]
        passing: list[Candidate] = []
        for member in members:
            refusal = _refuse(need, pool, member, by_node.get(member.name))
            if refusal is not None:
                refused.append(refusal)
            else:
                passing.append(member)
        if not passing:
            continue
        size = len(view.members) + sum(1 for t in taken if t.pool == pool.name and not _member(view, t.node))
        cap = pool.lend_cap(size)
        if cap is not None and lent + 1 > cap:
            refused.append(
                Refusal("*", pool.name, "max_lend", f"{lent} of {size} already lent, at most {cap}")
            )
            continue
        idle = sum(1 for m in members if m.idle and m.name not in by_node)
        if idle - 1 < pool.min_idle:
            refused.append(
                Refusal("*", pool.name, "min_idle", f"{idle} idle, keeps at least {pool.min_idle}")
            )
            continue
        passing.sort(key=lambda m: (not _same_block(need, m), m.name))
        best = passing[0]
        why = f"{best.name} from {pool.kind} pool {pool.name}"
        if _same_block(need, best):
            why += f", in the failed node's topology block {need.topology}"
        return Choice(best.name, pool.name, why, tuple(refused))
    if not pools:
        return Choice(why="no pool is configured")
    reasons = "; ".join(_says(r) for r in refused) or "the pools have no member"
    return Choice(why=f"no node to take: {reasons}", refused=tuple(refused))


def _refuse(need: Need, pool: Pool, node: Candidate, other: Taken | None) -> Refusal | None:
    def no(guard: Guard, detail: str) -> Refusal:
        return Refusal(node.name, pool.name, guard, detail)

    if other is not None:
        return no("taken", f"taken by incident {other.incident}")
    if node.open_incident:
        return no("open_incident", "has an open incident")
    if node.opt_out:
        return no("opt_out", "carries the opt-out label")
    if need.gpu_type and node.gpu_type and need.gpu_type != node.gpu_type:
        return no("gpu_type", f"GPU {node.gpu_type}, the failed node has {need.gpu_type}")
    if need.gpus is not None and node.gpus is not None and need.gpus != node.gpus:
        return no("gpu_count", f"{node.gpus} GPUs, the failed node has {need.gpus}")
    if not node.idle:
        return no("busy", "not idle")
    return None


def _member(view: PoolView, node: str) -> bool:
    return any(m.name == node for m in view.members)


def _same_block(need: Need, node: Candidate) -> bool:
    return need.topology is not None and node.topology == need.topology


def _says(refusal: Refusal) -> str:
    where = refusal.pool if refusal.node == "*" else f"{refusal.node} ({refusal.pool})"
    return f"{where}: {refusal.guard} — {refusal.detail}"
