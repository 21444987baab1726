"""The replace and wait_ready steps' own judgement, in virtual time against the simulated far side.

Cases: a pod the drain evicted that never leaves holds the drain until its deadline, which escalates
naming it; another system already repairing the node (``repair_owner``) means no replacement of pitcrew's:
the step records who and the incident waits for that system's node; Slurm jobs or workload pods
still on the node refuse the replacement until the deadline, then escalate naming them; the
playbook's ``force`` option replaces anyway and says so in the timeline; with a ``fault_query`` and
Prometheus configured, ``wait_ready`` waits while the node still reports the fault. The replacement
is told the Slurm nodes the node carried, and the StatefulSet-mode NodeSet pods the drain evicted. An
old node its repair system cannot take away is told once, holding nothing up.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bot.engine.ports import OldNodeLook, PodRef
from bot.engine.steps.notify import AFTER_CLOSE
from tests.engine.harness import Answer, Call, EngineHarness, FakeTime, Through, transient

NODE = "gpu-node-02"
STEPS = ["notify", "slurm_down", "cordon", "drain", "replace", "wait_ready", "slurm_resume", "close"]


#: Without a drain: the replace step itself meets the workload still on the node.
UNDRAINED = [s for s in STEPS if s != "drain"]


def _playbook(steps: list[str] = STEPS, **options: dict[str, Any]) -> dict[str, Any]:
    made = [{"step": s, **options[s]} if s in options else s for s in steps]
    return {"playbooks": {"replace-node": {"steps": made}}}


async def test_the_replacement_is_told_the_slurm_nodes_the_node_carried(tmp_path: Path) -> None:
    """What the node's Slurm nodes were (the slurm_down step's record) goes with the replacement:
    a StatefulSet-mode NodeSet makes their slurmd pods again elsewhere, and the Kubernetes adapter
    knows them by those names (their ``pod-hostname``)."""
    async with EngineHarness(tmp_path, **_playbook()) as h:
        incident = await h.alert(NODE)
        done = await h.until_ended(incident)
        assert done.state.value == "resolved"
        [replaced] = [r for r in h.records() if r.get("op") == "replace"]
        assert replaced["slurm_nodes"] == ["gpu-node-02"]  # the simulated mapping is the identity


SLURMD = PodRef("slurm", "slurm-worker-gpu-0", owner_kind="NodeSet", nodeset_replica=True)


async def test_the_replacement_is_told_the_nodeset_pods_the_drain_evicted(tmp_path: Path) -> None:
    """A StatefulSet-mode NodeSet's slurmd pod, once evicted and gone, may not be made again by the
    time the replacement starts (slurm-operator makes it on a later sync): the drain records it, and
    the replacement is told, so the Kubernetes adapter waits for it as Karpenter's demand rather
    than adding a placeholder of its own (a second node)."""
    async with EngineHarness(tmp_path, **_playbook()) as h:

        def until_evicted(pods: list[PodRef]) -> list[PodRef]:
            evicted = any(r.get("op") == "evict" and r.get("pod") == SLURMD.ref for r in h.records())
            return pods if evicted else [*pods, SLURMD]

        h.cluster.always("pods_on_node", Answer(until_evicted))
        incident = await h.alert(NODE)
        done = await h.until_ended(incident)
        assert done.state.value == "resolved"
        [replaced] = [r for r in h.records() if r.get("op") == "replace"]
        assert replaced["nodeset_pods"] == [SLURMD.ref]
        assert (await h.steps(incident))["drain"].result["nodeset_replicas"] == [SLURMD.ref]


async def test_a_repair_already_under_way_is_waited_for_not_repeated(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, **_playbook()) as h:
        h.cluster.always(
            "repair_owner", Answer(lambda _: "karpenter (disruption taint karpenter.sh/disrupted)")
        )
        incident = await h.alert(NODE)
        done = await h.until_ended(incident)
        assert done.state.value == "resolved"
        assert h.calls()[("replace", NODE)] == 0
        [note] = await h.events(incident, "repair_elsewhere")
        assert "karpenter" in note.detail
        result = (await h.steps(incident))["replace"]
        assert result.status == "ok"


#: A pod that never leaves the node (a stuck finalizer, a controller re-binding it): the step that
#: meets it, that step's options, and what its escalation must name.
STRAGGLER = PodRef("training", "straggler", owner_kind="Job")
NEVER_LEAVES = {
    # The drain evicted it, and waits for it to go until its deadline.
    "drain holds": (_playbook(drain={"timeout": "60s"}), ("drain", "training/straggler")),
    # Without a drain, the replace step refuses while it is there.
    "replace refused": (
        _playbook(UNDRAINED, replace={"timeout": "60s", "attempts": 3}),
        ("pod training/straggler",),
    ),
}


@pytest.mark.parametrize("case", list(NEVER_LEAVES))
async def test_a_pod_that_never_leaves_fails_the_incident_naming_it(tmp_path: Path, case: str) -> None:
    playbook, named = NEVER_LEAVES[case]
    async with EngineHarness(tmp_path, **playbook) as h:
        h.cluster.always("pods_on_node", Answer(lambda pods: [*pods, STRAGGLER]))
        incident = await h.alert(NODE)
        done = await h.until_ended(incident)
        assert done.state.value == "failed"
        assert h.calls()[("replace", NODE)] == 0
        [escalation] = h.notices("escalation", incident)
        text = " ".join(escalation["lines"]) + escalation["title"]
        assert all(words in text for words in named), text


async def test_force_replaces_anyway_and_says_so(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, **_playbook(UNDRAINED, replace={"options": {"force": True}})) as h:
        h.cluster.always("pods_on_node", Answer(lambda pods: [*pods, STRAGGLER]))
        incident = await h.alert(NODE)
        done = await h.until_ended(incident, within=7200)
        assert h.calls()[("replace", NODE)] == 1
        [forced] = await h.events(incident, "forced")
        assert "pod training/straggler" in forced.detail and "option force" in forced.detail
        assert done.state.value == "resolved"


class _Prometheus:
    """Reports the fault series for the node until ``until`` virtual seconds have passed."""

    def __init__(self, h: EngineHarness, until: float) -> None:
        self.h, self.until = h, until
        self.asked: list[str] = []

    async def instant(self, promql: str) -> list[tuple[dict[str, str], float]]:
        self.asked.append(promql)
        return [({"node": NODE}, 79.0)] if self.h.time.elapsed < self.until else []


async def test_wait_ready_waits_while_prometheus_still_reports_the_fault(tmp_path: Path) -> None:
    query = 'pitcrew:gpu_xid:recent{node="{node}"}'
    async with EngineHarness(tmp_path, **_playbook(wait_ready={"options": {"fault_query": query}})) as h:
        prometheus = _Prometheus(h, until=300)
        h.deps.ports.query = prometheus
        incident = await h.alert(NODE)
        done = await h.until_ended(incident)
        assert done.state.value == "resolved"
        assert prometheus.asked and set(prometheus.asked) == {f'pitcrew:gpu_xid:recent{{node="{NODE}"}}'}
        waits = [e.detail for e in await h.events(incident, "step_waiting", "wait_ready")]
        assert any("Prometheus still reports the fault" in w for w in waits)
        finished = (await h.events(incident, "step_finished", "wait_ready"))[-1]
        assert (finished.at - done.opened_at).total_seconds() >= 300


async def test_a_look_that_fails_for_a_moment_while_waiting_for_the_node_is_retried(tmp_path: Path) -> None:
    """An API request timing out while the replacement is awaited (a Machine list, a node read)
    is retried with backoff like any call, not the end of the incident."""
    async with EngineHarness(tmp_path) as h:
        h.cluster.script("successor", *transient(2), Through())
        incident = await h.alert(NODE)
        done = await h.until_ended(incident)
        assert done.state.value == "resolved", await h.timeline(incident)
        retries = [e for e in await h.events(incident, "step_retry") if e.step == "wait_ready"]
        assert len(retries) == 2


HELD = (
    "Karpenter cannot finish terminating the old node gpu-node-02 (NodeClaim gpu-h100-x7k2q deleting, "
    "finalizer karpenter.sh/termination): it may not evict pod training/notebook-0 (annotated "
    "karpenter.sh/do-not-disrupt); the NodeClaim has no spec.terminationGracePeriod, so Karpenter "
    "waits for them for ever"
)


async def test_an_old_node_its_repair_system_cannot_take_away_is_told_once_and_holds_nothing(
    tmp_path: Path,
) -> None:
    """Karpenter's termination of the replaced node waits on a pod it may not evict (the Kubernetes
    adapter's ``termination_held``): humans are told once, in the timeline and a notice naming what
    holds it, while ``wait_ready`` polls; the successor's path and the incident go on."""
    async with EngineHarness(tmp_path, **_playbook()) as h:
        h.cluster.always("termination_held", Answer(lambda _: OldNodeLook(held=HELD)))
        incident = await h.alert(NODE)
        done = await h.until_ended(incident)
        assert done.state.value == "resolved"
        [note] = await h.events(incident, "termination_held")
        assert note.detail == HELD
        [notice] = h.notices("termination_held", incident)
        assert HELD in notice["lines"] and notice["severity"] == "warning", notice
        assert (await h.steps(incident))["wait_ready"].result["termination_held"] == HELD
        # Told once: the look at close finds it told already, and only says it in the summary.
        [summary] = h.notices("summary", incident)
        assert f"the replaced node is not going away: {HELD}" in summary["lines"], summary


async def test_a_hang_of_the_old_node_seen_only_after_the_successor_is_ready_is_told_at_close(
    tmp_path: Path,
) -> None:
    """Karpenter's termination stalls where pitcrew can tell only a while after the NodeClaim's
    delete (a budget's refusal, seen a minute into its drain; volumes not detached past six
    minutes), and the successor may be Ready at once (a NodeSet's pod landing on an existing node):
    the look at ``close`` tells it then, once, in the timeline, a notice and the summary; nothing
    waits on it."""
    async with EngineHarness(tmp_path, **_playbook()) as h:

        def later(_: OldNodeLook) -> OldNodeLook:
            resumed = any(r.get("op") == "slurm_resume" for r in h.records())
            return OldNodeLook(held=HELD) if resumed else OldNodeLook()

        h.cluster.always("termination_held", Answer(later))
        incident = await h.alert(NODE)
        done = await h.until_ended(incident)
        assert done.state.value == "resolved"
        assert (await h.steps(incident))["wait_ready"].result["termination_held"] is None
        [note] = await h.events(incident, "termination_held")
        assert note.detail == HELD and note.step == "close"
        [notice] = h.notices("termination_held", incident)
        assert HELD in notice["lines"] and notice["severity"] == "warning", notice
        [summary] = h.notices("summary", incident)
        assert f"the replaced node is not going away: {HELD}" in summary["lines"], summary


async def test_the_old_node_is_not_looked_at_again_once_it_is_gone(tmp_path: Path) -> None:
    """Each look lists the old node's pods and events; once its NodeClaim is gone there is nothing
    more to see: ``wait_ready`` looks no more however long it still waits, nor does ``close``."""
    async with EngineHarness(tmp_path, **_playbook()) as h:

        async def none_a_minute_later(time: FakeTime, call: Call) -> None:
            await time.sleep(60)  # the wait goes on for minutes, past several looks

        h.cluster.script("successor", *[none_a_minute_later for _ in range(8)])
        h.cluster.always("termination_held", Answer(lambda _: OldNodeLook(gone=True)))
        incident = await h.alert(NODE)
        done = await h.until_ended(incident)
        assert done.state.value == "resolved"
        assert h.cluster.calls["successor"] > 8
        assert h.cluster.calls["termination_held"] == 1
        assert (await h.steps(incident))["wait_ready"].result["old_node_gone"] is True


async def test_a_hang_that_shows_only_after_close_is_told_by_the_watch_after_close(tmp_path: Path) -> None:
    """Karpenter's termination may stall where pitcrew can tell only minutes after the incident
    closed (its volumes still attached six minutes into the detach wait, a budget's refusal a minute
    into a drain that began late): an old node still going at ``close`` is looked at every 30 s for
    a while after it, and a hang is told then, once, in the closed incident's timeline and a
    notice; the looks stop once it is told."""
    async with EngineHarness(tmp_path, **_playbook()) as h:
        closed_at: list[float] = []

        def after_close(_: OldNodeLook) -> OldNodeLook:
            if closed_at and h.time.elapsed - closed_at[0] > 300:
                return OldNodeLook(held=HELD)
            return OldNodeLook()

        h.cluster.always("termination_held", Answer(after_close))
        incident = await h.alert(NODE)
        done = await h.until_ended(incident)
        assert done.state.value == "resolved"
        closed_at.append(h.time.elapsed)
        [summary] = h.notices("summary", incident)
        assert not any("not going away" in line for line in summary["lines"]), summary
        note = await h.until_event(incident, "termination_held", within=1200)
        assert note.detail == HELD and note.step == "close"
        [notice] = h.notices("termination_held", incident)
        assert HELD in notice["lines"] and notice["severity"] == "warning", notice
        looks = h.cluster.calls["termination_held"]
        await h.time.advance(3600)
        assert h.cluster.calls["termination_held"] == looks
        assert len(h.notices("termination_held", incident)) == 1


async def test_the_watch_after_close_stops_once_the_old_node_is_gone_or_its_time_is_up(
    tmp_path: Path,
) -> None:
    """The watch after ``close`` costs one look every 30 s, and only while there is something to
    see: it stops once the old node is gone, telling nothing, and after ``AFTER_CLOSE`` whatever it
    found. An old node still there then, with nothing seen holding it, is told once (an info
    notice and the closed incident's timeline): its instance may still be billed, and nobody looks
    at it after that."""
    async with EngineHarness(tmp_path, **_playbook()) as h:
        gone_after: list[float] = []

        def goes(_: OldNodeLook) -> OldNodeLook:
            return OldNodeLook(gone=bool(gone_after) and h.time.elapsed > gone_after[0])

        h.cluster.always("termination_held", Answer(goes))
        first = await h.alert(NODE)
        await h.until_ended(first)
        gone_after.append(h.time.elapsed + 120)
        await h.time.advance(600)
        looks = h.cluster.calls["termination_held"]
        assert looks >= 4  # at close, then every 30 s until it was seen gone
        await h.time.advance(3600)
        assert h.cluster.calls["termination_held"] == looks
        assert not h.notices("termination_held", first)
        assert not h.notices("old_node_stayed", first)
        assert not await h.events(first, "old_node_stayed")

    async with EngineHarness(tmp_path / "never", **_playbook()) as h:
        h.cluster.always("termination_held", Answer(lambda _: OldNodeLook()))
        second = await h.alert(NODE)
        await h.until_ended(second)
        await h.time.advance(AFTER_CLOSE.total_seconds() + 120)
        looks = h.cluster.calls["termination_held"]
        await h.time.advance(3600)
        assert h.cluster.calls["termination_held"] == looks
        assert not h.notices("termination_held", second)
        [note] = await h.events(second, "old_node_stayed")
        assert note.step == "close" and NODE in (note.detail or ""), note
        [notice] = h.notices("old_node_stayed", second)
        assert notice["severity"] == "info" and NODE in notice["title"], notice
        assert any("15 minutes after the incident closed" in line for line in notice["lines"]), notice
