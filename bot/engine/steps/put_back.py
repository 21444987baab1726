"""A Slurm node this incident took out, put back in service by other hands before its repair is
confirmed: looked for by every step that waits while the node is out by pitcrew's hand (``drain``,
``replace``, ``wait_ready``) and before a reset or a reboot acts on the node, one rule for all of them.

Other hands: a person's ``scontrol update State=RESUME``, or Slurm's own
(``SlurmctldParameters=idle_on_node_suspend`` clears DOWN and DRAIN as power saving suspends a
node, ``power_save.c``; ``scontrol reboot nextstate=RESUME`` or ``ASAP`` clears them once it
rebooted). Jobs may land on the node meanwhile. pitcrew does not take it out again over that hand;
it says so once per Slurm node and incident, in the timeline and to humans, whichever step sees it
first (each looking step records what it told in its ``put_back``; ``told_put_back`` reads them
all). The look is advice: a failed read is logged and waited out, never the step's failure.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TypeVar

from bot import logger
from bot.domain.nodemap import read_from_node
from bot.engine.context import StepContext, StepResult, Wait
from bot.engine.errors import PitcrewError
from bot.engine.ports import Notice
from bot.engine.steps.slurm import SlurmDownResult, held_out
from bot.store import codec

log = logger(__name__)

#: How often a waiting step looks beside its wait (``look_around``), in seconds.
LOOK_AGAIN = 30.0


@dataclass(frozen=True, slots=True)
class LooksAround(StepResult):
    """The result of a step that looks for the incident's Slurm nodes put back while it waits."""

    #: When it last looked beside the wait (``look_around``, every ``LOOK_AGAIN`` at most).
    looked_at: datetime | None = None
    #: The Slurm nodes this step found put back meanwhile, and told (``put_back_meanwhile``).
    put_back: tuple[str, ...] = ()


L = TypeVar("L", bound=LooksAround)


async def look_around(ctx: StepContext[L], look: Callable[[], Awaitable[object]]) -> None:
    """Run ``look`` at most every ``LOOK_AGAIN`` seconds of the step's waits (each a read or two,
    for as long as the wait lasts), the time recorded in the step's ``looked_at``."""
    now = ctx.clock()
    looked_at = ctx.progress.looked_at
    if looked_at is not None and (now - looked_at).total_seconds() < LOOK_AGAIN:
        return
    await look()
    await ctx.save(replace(ctx.progress, looked_at=now))


async def told_put_back(ctx: StepContext[L]) -> tuple[str, ...]:
    """The Slurm nodes any step of this incident found put back and told: this step's ``put_back``
    and that of every other looking step's result (a superseded one, from a plan since replaced,
    not counted)."""
    told = list(ctx.progress.put_back)
    registry = ctx.deps.registry
    steps = set(registry)
    for name, record in (await ctx.deps.store.steps_of(ctx.incident.id)).items():
        if name == ctx.step or record.status == "superseded" or name not in steps:
            continue
        kind = registry[name].result
        if issubclass(kind, LooksAround):
            result = codec.decode_record(kind, record.result)
            told += [n for n in result.put_back if n not in told]
    return tuple(told)


async def put_back_meanwhile(ctx: StepContext[L], *, replaced: bool, meanwhile: str) -> tuple[str, ...]:
    """Look whether a Slurm node this incident took out (``SlurmDownResult.owned``) is back in
    service (``held_out`` false), and say so once for each: a ``returned_early`` warning and a
    timeline note, ``meanwhile`` saying what the looking step does about it. Answers every Slurm
    node told put back so far, by any step. Not after a replacement (``replaced``: one issued) whose
    Slurm nodes the mapping reads from the node: the failed node's records may be left behind
    (``left_behind``), and where the mapping is ``slinky`` the operator, not pitcrew, took them out."""
    down = await ctx.result(SlurmDownResult)
    told = await told_put_back(ctx)
    if down is None or (replaced and read_from_node(ctx.settings.node_mapping)):
        return told
    for name in [n for n, owned in down.owned.items() if owned and n not in told]:
        try:
            state = await ctx.ports.scheduler.node(name)
        except PitcrewError as exc:
            log.info(
                "could not look whether a Slurm node was put back",
                extra={"slurm_node": name, "reason": str(exc)},
            )
            continue
        if held_out(state, ctx.incident.id):
            continue
        shows = "/".join(sorted(state.states)) + (f", reason {state.reason!r}" if state.reason else "")
        await ctx.tell(
            Notice(
                ctx.incident.id,
                "returned_early",
                f"{ctx.node}: Slurm node {name} is back in service before its repair is confirmed",
                (
                    f"Slurm shows {name} {shows}. pitcrew took it out for {ctx.plan.summary} and has "
                    "not returned it: a person's RESUME did, or Slurm's own (SlurmctldParameters="
                    "idle_on_node_suspend, scontrol reboot nextstate=RESUME or ASAP).",
                    "Jobs may run on it before the repair is confirmed. pitcrew does not take it out "
                    f"again over that hand. {meanwhile}",
                    f"To keep jobs off it until then, and have pitcrew return it after the repair: "
                    f'scontrol update NodeName={name} State=DRAIN Reason="{ctx.reason()}"',
                ),
                severity="warning",
                node=ctx.node,
            ),
            key=f"returned_early:{name}",
        )
        await ctx.note(
            "returned_early", f"Slurm node {name} back in service ({shows}) before its repair is confirmed"
        )
        told = (*told, name)
        await ctx.save(replace(ctx.progress, put_back=(*ctx.progress.put_back, name)))
    return told


#: What a step that empties or repairs the node does about a Slurm node put back (``drain``,
#: ``reset_gpu``, ``reboot``): said in the notice.
NEWCOMERS_WAITED_FOR = (
    "Jobs that start on it meanwhile were let on by that hand, not pitcrew: pitcrew does not "
    "requeue them, and neither empties the node nor repairs it under them; it waits for them to "
    "leave (they finish, or their owner or an admin requeues or scancels them), and the incident "
    "goes to a human if they are still there when the step's time runs out."
)


async def look_for_newcomers(ctx: StepContext[L]) -> tuple[str, ...] | None:
    """The look of a step that empties or repairs the node (``look_around``: on its first pass, then
    every ``LOOK_AGAIN``): the Slurm nodes told put back so far, or ``None`` where this pass did not
    look (``newcomers`` reads them then)."""
    put_back: tuple[str, ...] | None = None

    async def look() -> None:
        nonlocal put_back
        put_back = await put_back_meanwhile(ctx, replaced=False, meanwhile=NEWCOMERS_WAITED_FOR)

    await look_around(ctx, look)
    return put_back


async def newcomers(ctx: StepContext[L], put_back: tuple[str, ...] | None) -> Wait | None:
    """Jobs that started on the incident's Slurm nodes after other hands put one back in service
    (``put_back``: told so far, by any step; re-read here when this pass did not look): none that
    pitcrew recorded before its DOWN or DRAIN (``SlurmDownResult.jobs``, which the drain's grace and
    requeue are for). A person let them onto the node: pitcrew requeues none of them, nor empties
    the node under them (evicting slurmd) or repairs it (a reset, a reboot): the step waits for them
    to leave, and at its deadline the escalation names them."""
    down = await ctx.result(SlurmDownResult)
    if down is None:
        return None
    if put_back is None:
        put_back = await told_put_back(ctx)
    recorded = {j.job_id for j in down.jobs or ()}
    found = []
    for name in [n for n in down.slurm_nodes or () if n in put_back]:
        found += [j for j in await ctx.ports.scheduler.jobs_on_node(name) if j.job_id not in recorded]
    if not found:
        return None
    return Wait(
        ctx.poll,
        f"waiting for {len(found)} job(s) that started on the node after it was put back in "
        f"service by other hands, not requeued by pitcrew: {'; '.join(j.who for j in found)}",
    )
