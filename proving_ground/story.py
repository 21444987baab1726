"""What one demo run watches and what it reports: milestones from pitcrew, Slurm and Prometheus.

Owns following an incident as it advances — the firing alert from Prometheus, the incident and
its timeline from pitcrew's read API (pitcrew's own timestamps), the training job from Slurm and
from its checkpoint files, the replacement from the proving ground — and turning the milestones
into the summary: time to recovery by stage, pitcrew's own share, the GPU-hours lost, the
thread as text. It changes nothing but the fault it injects and, where the scenario says so,
the approval a person would give.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from proving_ground.proc import DemoError
from proving_ground.scenarios import BREAKER_NODES
from proving_ground.train_job import read_checkpoint, read_progress

if TYPE_CHECKING:
    from proving_ground.ground import ProvingGround
    from proving_ground.run import DemoOptions
    from proving_ground.timeline import Timeline

TERMINAL = ("resolved", "failed", "suppressed", "rolled_back")
#: Playbooks that never touch a node: their incidents are notices beside a scenario, not its subject.
HANDS_OFF = ("notify-only", "ignore")
#: Steps that touch a node (Slurm or Kubernetes): none may start for an application fault.
NODE_STEPS = ("slurm_down", "slurm_drain", "cordon", "drain", "replace", "reboot", "reset_gpu")
#: GPUs of one node (the training job holds all of them): the unit of the GPU-hours lost.
GPUS_PER_NODE = 8
POLL = 0.2
#: How people recognise pitcrew's breaker notice and a storm digest in the channel.
BREAKER_WORDS = "circuit breaker opened"
DIGEST_WORDS = "gpu fault storm"
#: An incident's closing summary: the one reply of its thread also sent to the channel.
SUMMARY_WORDS = "(also sent to the channel)"
#: (name, from milestone, to milestone, whose time it is) of the recovery, in order.
STAGES = (
    ("detection", "fault", "webhook", "Prometheus scrape + rule evaluation, Alertmanager"),
    ("decision", "webhook", "slurm_down", "pitcrew: admit, guard, notify, take the node out"),
    ("slurm", "slurm_down", "job_running", "Slurm: requeue and start the job elsewhere"),
    ("kubernetes", "slurm_down", "drain", "cordon and drain (Kubernetes API emulator)"),
    ("replacement wait", "replace", "node_ready", "Machine deleted → the emulated new node Ready"),
    ("job restart", "job_running", "job_progress", "the job loading its checkpoint and stepping on"),
    ("close", "node_ready", "closed", "pitcrew: slurmd back, RESUME, confirm, close"),
)


def epoch(stamp: str | None) -> float | None:
    return None if not stamp else datetime.fromisoformat(stamp).timestamp()


class Story:
    """One scenario's run against a started proving ground."""

    def __init__(self, ground: ProvingGround, timeline: Timeline, options: DemoOptions) -> None:
        self.ground, self.tl, self.options = ground, timeline, options
        self.scenario = options.scenario
        assert ground.pitcrew is not None and ground.prometheus is not None and ground.standin is not None
        self.pitcrew, self.prometheus, self.standin = ground.pitcrew, ground.prometheus, ground.standin
        self.slurm = ground.slurm
        self.job_id = ""
        self.node = ""
        self.targets: list[str] = []
        self.checkpoint_at_fault = 0
        self.incident_id: str | None = None
        self.incident: dict[str, Any] = {}
        self.incidents: dict[str, dict[str, Any]] = {}
        self.new_node: str | None = None
        self.resumed_from: int | None = None
        self.approved_by: str | None = None
        self.verdict: list[str] = []
        self.deadline = 0.0

    # ------------------------------------------------------------------ the run
    def play(self) -> int:
        self._training()
        fault = self.scenario.fault
        others = [n for n in self.ground.nodes if n != self.node]
        self.targets = [self.node, *others[: self.scenario.fault_nodes - 1]]
        self.checkpoint_at_fault = read_checkpoint(self.slurm.job_dir, self.job_id)
        for target in self.targets:
            self.standin.node(target).inject(fault.kind, gpu=fault.gpu, **dict(fault.params))
        more = f" and {len(self.targets) - 1} more nodes" if len(self.targets) > 1 else ""
        self.tl.mark(
            "fault",
            f"{fault.describe()} of {self.node}{more} (job {self.job_id} at checkpoint {self.checkpoint_at_fault})",
        )
        self.deadline = time.monotonic() + self.options.timeout
        plays: dict[str, Callable[[], bool]] = {
            "recover": self._recover,
            "notify_only": self._notify_only,
            "breaker": self._storm,
        }
        return 0 if plays[self.scenario.outcome]() else 1

    def _training(self) -> None:
        self.job_id = self.slurm.submit_training(steps=100_000)
        with self.tl.waiting(f"training job {self.job_id} to run and write its first checkpoint"):
            self._until_plain(lambda: self._job_node() is not None, 60, f"job {self.job_id} RUNNING")
            self._until_plain(
                lambda: read_checkpoint(self.slurm.job_dir, self.job_id) >= 2, 60, "a checkpoint"
            )
        self.node = self._job_node() or ""
        self.tl.say(
            f"  training job {self.job_id} runs on {self.node}, checkpoint at step "
            f"{read_checkpoint(self.slurm.job_dir, self.job_id)}"
        )

    def _recover(self) -> bool:
        self._until("the alert to fire and reach pitcrew", lambda: self.tl.at("webhook") is not None)
        if self.scenario.approval:
            self._until("pitcrew to ask for approval", lambda: self.tl.at("approval") is not None)
            self._approve()
        self._until("Slurm to take the node out", lambda: self.tl.at("slurm_down") is not None)
        self._until(
            "the job to run again from its checkpoint", lambda: self.tl.at("job_progress") is not None
        )
        self._until("the replacement and the incident's close", lambda: self.tl.at("closed") is not None)
        self._until("the closing summary to reach the Slack thread", self._summary_posted)
        state = self.incident.get("state")
        outcome = self.incident.get("outcome") or ""
        self.verdict.append(
            f"incident {self.incident_id} {state}" + (f": {outcome}" if outcome != state else "")
        )
        self.verdict.append(
            f"job {self.job_id} resumed from checkpoint {self.resumed_from} on {self.new_node} "
            f"(checkpoint at the fault: {self.checkpoint_at_fault})"
        )
        return state == "resolved" and (self.resumed_from or 0) >= self.checkpoint_at_fault

    def _approve(self) -> None:
        assert self.incident_id is not None
        if self.options.interactive:
            config = self.pitcrew.config_path
            self.tl.say(f"  approve it yourself:  pitcrew approve {self.incident_id} -c {config}")
            click = self.ground.far_side.click_help(self.incident_id)
            if click is not None:
                self.tl.say(f"  or click it in Slack: {click}")
            self._until("your approval", lambda: self.tl.at("approved") is not None, timeout=1800)
            return
        answer = self.ground.far_side.approve(self.pitcrew, self.incident_id)
        self.tl.say(f"  the demo approves as a person would: {answer}")
        self._until("the approval to be recorded", lambda: self.tl.at("approved") is not None)

    def _notify_only(self) -> bool:
        self._until("the alert to fire and reach pitcrew", lambda: self.tl.at("webhook") is not None)
        self._until("pitcrew to tell humans", lambda: self.tl.at("notified") is not None)
        settle = time.monotonic() + 5
        self._until("5 s more, to see that nothing is touched", lambda: time.monotonic() > settle)
        calls = self.ground.far_side.node_calls(self.node)
        started = [e["step"] for e in self.incident.get("events", []) if e["kind"] == "step_started"]
        touched = [s for s in started if s in NODE_STEPS]
        job = self.slurm.job(self.job_id)
        still = job is not None and job.state == "RUNNING" and job.nodes == (self.node,) and job.restarts == 0
        self.tl.mark(
            "verdict",
            f"playbook {self.incident.get('playbook')}: node calls {calls or 'none'}, node steps "
            f"{touched or 'none'}; job {self.job_id} {'still running on ' + self.node if still else 'disturbed'}",
        )
        self.verdict.append(
            f"incident {self.incident_id}: playbook {self.incident.get('playbook')}, touched nothing"
        )
        return not calls and not touched and still

    def _storm(self) -> bool:
        self._until(
            f"pitcrew to plan an incident for each of the {len(self.targets)} nodes",
            lambda: (
                len(self.incidents) >= len(self.targets)
                and all(i["playbook"] is not None and i["state"] != "open" for i in self.incidents.values())
            ),
        )
        acted = self._acted()
        held = [n for n, i in self.incidents.items() if i["state"] == "suppressed"]
        self._until(
            "the breaker's notice and the storm's digest to reach the channel",
            lambda: all(self._channel_counts()[k] >= 1 for k in ("breaker", "digest")),
        )
        counts = self._channel_counts()
        self.tl.mark(
            "breaker",
            f"{len(acted)} nodes let through ({', '.join(sorted(acted))}), {len(held)} held by the breaker; "
            f"{counts['breaker']} breaker notice, {counts['digest']} storm digest",
        )
        self._until(
            "the let-through nodes to be replaced and their incidents closed",
            lambda: all(self.incidents[n]["state"] in TERMINAL for n in self._acted()),
        )
        self.tl.mark("closed", f"{len(acted)} incidents closed")
        acted = self._acted()
        self._until(
            "each closed incident's summary to reach the channel",
            lambda: all(self._shown_closed(n) for n in acted),
        )
        # The digest is rewritten at most once a second: the channel printed is its last version,
        # the one that counts every node of the storm and names each held one.
        self._until(
            "the storm's digest to show every node",
            lambda: self._digest_shows(len(self.targets), held),
        )
        self.verdict.append(
            f"{len(acted)} of {len(self.targets)} nodes acted on (breaker limit {BREAKER_NODES})"
        )
        counts = self._channel_counts()
        self.verdict.append(
            f"{len(held)} incidents suppressed by the breaker; {counts['breaker']} breaker notice"
        )
        self.verdict.append(
            f"the channel shows {counts['messages']} messages for {len(self.targets)} faulty nodes: "
            f"{counts['digest']} storm digest (updated as nodes joined), {counts['breaker']} breaker notice"
        )
        untouched = [n for n in self.targets if n not in acted and self.ground.far_side.node_calls(n)]
        return (
            1 <= len(acted) <= BREAKER_NODES
            and counts["breaker"] == 1
            and counts["digest"] <= 1
            and not untouched
        )

    def _summary_posted(self) -> bool:
        """The thread holds the closing summary and the close step's own reply (posted after it),
        and its parent shows the incident's end (the last edit, delivered after both): the thread
        printed and written to the transcript is the one people are left with."""
        assert self.incident_id is not None
        thread = self.ground.far_side.thread(self.incident_id)
        state = self.incident.get("state")
        return (
            bool(thread)
            and any(SUMMARY_WORDS in n.text() for n in thread)
            and any(" close: " in n.title for n in thread)
            and f"Status:* {state} " in thread[0].text()
        )

    def _shown_closed(self, node: str) -> bool:
        """The channel tells people ``node``'s incident ended: its summary, sent to the channel, or
        (an incident that opened once the storm's digest had started) its line in the digest."""
        for notice in self.ground.far_side.thread():
            text = notice.text()
            if SUMMARY_WORDS in text and f"{node}: " in text:
                return True
            if DIGEST_WORDS in text.lower() and any(
                line.startswith(f"• {node} — ") and any(f" — {s} (" in line for s in TERMINAL)
                for line in notice.lines
            ):
                return True
        return False

    def _digest_shows(self, nodes: int, held: list[str]) -> bool:
        """A storm digest in the channel counts ``nodes`` nodes and names each ``held`` one among
        those the breaker held (``node (incident)``). A line of the node list is not enough: a node
        is listed there from its first version of the digest, before the breaker held it."""
        wanted = [f"{node} ({self.incidents[node]['id']})" for node in held]
        for notice in self.ground.far_side.thread():
            text = notice.text()
            if f"{DIGEST_WORDS}: {nodes} nodes" in text.lower() and all(w in text for w in wanted):
                return True
        return False

    def _channel_counts(self) -> dict[str, int]:
        """What the channel shows: its messages, the breaker's notices and storm digests among them."""
        shown = [n.text().lower() for n in self.ground.far_side.thread()]
        return {
            "messages": len(shown),
            "breaker": sum(BREAKER_WORDS in text for text in shown),
            "digest": sum(DIGEST_WORDS in text for text in shown),
            "summaries": sum(SUMMARY_WORDS in text for text in shown),
        }

    def _acted(self) -> list[str]:
        return [
            n
            for n, i in self.incidents.items()
            if any(e["kind"] == "action" for e in i.get("events", [])) or i["state"] == "resolved"
        ]

    # ------------------------------------------------------------------ watching
    def _until(self, what: str, done: Callable[[], bool], timeout: float | None = None) -> None:
        """Observe everything until ``done``; ``DemoError`` at the run's deadline."""
        deadline = self.deadline if timeout is None else time.monotonic() + timeout
        with self.tl.waiting(what):
            while True:
                self._observe()
                if done():
                    return
                if self.ground.replace_errors:
                    raise DemoError(f"the replacement failed: {self.ground.replace_errors[0]}")
                if time.monotonic() > deadline:
                    raise DemoError(f"timed out waiting for {what} (logs: {self.ground.workdir})")
                time.sleep(POLL)

    @staticmethod
    def _until_plain(done: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                raise DemoError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(POLL)

    def _job_node(self) -> str | None:
        job = self.slurm.job(self.job_id)
        return job.nodes[0] if job is not None and job.state == "RUNNING" and job.nodes else None

    def _observe(self) -> None:
        tl = self.tl
        if tl.at("firing") is None and self.prometheus.query(
            f'ALERTS{{alertstate="firing",node="{self.node}"}}'
        ):
            names = {s["metric"]["alertname"] for s in self.prometheus.query(f'ALERTS{{node="{self.node}"}}')}
            tl.mark("firing", ", ".join(sorted(names)))
        if self.scenario.outcome == "breaker":
            self._observe_storm()
            return
        self._observe_incident()
        self._observe_job()
        joined = self.ground.replaced.get(self.node)
        if joined is not None and tl.at("replace") is not None:
            successor = self.ground.successors.get(self.node, "its successor")
            tl.mark(
                "node_ready",
                f"{successor} Ready in Kubernetes; slurmd {self.node} registered again",
                at=joined,
            )
        if self.incident.get("state") in TERMINAL:
            state, outcome = self.incident["state"], self.incident.get("outcome") or ""
            words = state + (f": {outcome}" if outcome and outcome != state else "")
            tl.mark("closed", words, at=epoch(self.incident["closed_at"]))

    def _observe_incident(self) -> None:
        if self.incident_id is None:
            found = self.pitcrew.incidents(self.node)
            if not found:
                return
            self.incident_id = str(found[-1]["id"])
        self.incident = self.pitcrew.incident(self.incident_id)
        tl, inc = self.tl, self.incident
        faults = ", ".join(
            f"XID {f['xid']}" if f.get("xid") is not None else str(f.get("kind")) for f in inc["faults"]
        )
        tl.mark(
            "webhook", f"incident {self.incident_id} on {self.node} ({faults})", at=epoch(inc["opened_at"])
        )
        opened = self.ground.far_side.thread_opened(self.incident_id)
        if opened is not None and tl.at("webhook") is not None:
            tl.mark("notified", opened[1], at=opened[0])
        for event in inc["events"]:
            at, kind, step = epoch(event["at"]), event["kind"], event["step"]
            if kind == "state" and event["outcome"] == "awaiting_approval":
                tl.mark("approval", f"{inc['playbook']} waits for one of the approvers", at=at)
            elif kind == "approved":
                self.approved_by = event["actor"]
                tl.mark("approved", f"by {event['actor']}", at=at)
            elif kind == "action" and event["data"].get("action") == "slurm_down":
                tl.mark("slurm_down", event["detail"], at=at)
            elif kind == "step_finished" and step in ("cordon", "drain", "reset_gpu", "reboot"):
                tl.mark(step, event["detail"], at=at)
            elif kind == "step_finished" and step == "replace":
                # The handle: "<strategy> <kind>/<namespace>/<name> since=... gpus=... pool=...".
                handle = " ".join(str(_result(inc, "replace").get("handle") or "").split()[:2])
                tl.mark(
                    "replace",
                    f"{handle + ' deleted' if handle else event['detail']} (the emulated MachineSet's new "
                    "node turns Ready "
                    f"after {self.ground.replace_delay:.0f}s)",
                    at=at,
                )

    def _observe_job(self) -> None:
        tl = self.tl
        if tl.at("slurm_down") is None or tl.at("job_progress") is not None:
            return
        job = self.slurm.job(self.job_id)
        if tl.at("job_running") is None and job is not None and job.state == "RUNNING" and job.restarts >= 1:
            self.new_node = job.nodes[0] if job.nodes else None
            tl.mark("job_running", f"job {self.job_id} on {self.new_node}, restart {job.restarts}")
        progress = read_progress(self.slurm.job_dir, self.job_id)
        if (
            tl.at("job_running") is not None
            and progress is not None
            and int(progress.get("restart_count", 0)) >= 1
            and int(progress["step"]) > self.checkpoint_at_fault
        ):
            self.resumed_from = int(progress["resumed_from"])
            tl.mark(
                "job_progress",
                f"step {progress['step']} on {progress['node']}, resumed from checkpoint {self.resumed_from}",
            )

    def _observe_storm(self) -> None:
        tl = self.tl
        for summary in self.pitcrew.incidents():
            node = str(summary["node"])
            if node not in self.targets or summary.get("playbook") in HANDS_OFF:
                continue  # another node, or a notice beside the storm (its exporter missed scrapes)
            known = self.incidents.get(node)
            if known is None or known["state"] not in TERMINAL:
                self.incidents[node] = self.pitcrew.incident(str(summary["id"]))
        if self.incidents:
            first = min((epoch(i["opened_at"]) or 0.0) for i in self.incidents.values())
            tl.mark("webhook", f"{len(self.incidents)} incidents so far", at=first)
        if self.incident_id is None and self._acted():
            self.incident_id = str(self.incidents[self._acted()[0]]["id"])

    # ------------------------------------------------------------------ the report
    def summary(self) -> dict[str, Any]:
        tl = self.tl
        fault = tl.at("fault") or 0.0
        stages = {name: round(d, 3) for name, a, b, _ in STAGES if (d := tl.between(a, b)) is not None}
        report: dict[str, Any] = {
            "scenario": self.scenario.name,
            "job_id": self.job_id,
            "job_node": self.node,
            "new_node": self.new_node,
            "checkpoint_at_fault": self.checkpoint_at_fault,
            "resumed_from": self.resumed_from,
            "incident_id": self.incident_id,
            "incident_ids": {n: i["id"] for n, i in self.incidents.items()}
            or ({self.node: self.incident_id} if self.incident_id else {}),
            "approved_by": self.approved_by,
            "milestones": {
                m.key: {"at": _iso(m.at), "t": round(m.at - fault, 3), "detail": m.detail} for m in tl.marks
            },
            "stages": stages,
            "fault_to_job_running": _round(tl.between("fault", "job_running")),
            "fault_to_job_progress": _round(tl.between("fault", "job_progress")),
            "fault_to_closed": _round(tl.between("fault", "closed")),
            "pitcrew_own_seconds": _round(own_share(self.incident)) if self.incident else None,
            "verdict": self.verdict,
            "thread": [
                n.text()
                for n in self.ground.far_side.thread(
                    None if self.scenario.outcome == "breaker" else self.incident_id
                )
            ],
            "channel": self._channel_counts(),
            **self.ground.far_side.state(),
            "node_calls": {n: self.ground.far_side.node_calls(n) for n in self.targets},
            "workdir": str(self.ground.workdir),
            "slurm_conf": str(self.slurm.conf),
            "slurm_version": self.slurm.version,
            "slurm_bin_dir": str(self.slurm.bin_dir) if self.slurm.bin_dir else None,
            "pitcrew_url": self.pitcrew.url,
            "pitcrew_config": str(self.pitcrew.config_path),
            "read_token": self.pitcrew.read_token,
        }
        job_out = tl.between("fault", "job_progress")
        node_out = tl.between("slurm_down", "node_ready")
        report["gpu_hours_lost"] = {
            "job": _round(GPUS_PER_NODE * job_out / 3600, 4) if job_out is not None else None,
            "node_out_of_service": _round(GPUS_PER_NODE * node_out / 3600, 4)
            if node_out is not None
            else None,
            "how": f"computed by the demo from the timeline: {GPUS_PER_NODE} GPUs x (fault → job past its "
            "checkpoint) for the job, x (Slurm DOWN → replacement Ready) for the node; pitcrew's own figures, "
            "counted from the fault, are in its close summary, `pitcrew incidents show` and "
            "pitcrew_gpu_hours_lost_total",
        }
        return report


def own_share(incident: dict[str, Any]) -> float:
    """pitcrew's own time in an incident, from its own timeline: from opening the incident to its first
    step, plus every gap between a step (or an approval) ending and the next step starting. Time
    spent inside steps is the far side's (Slurm, Kubernetes, the notifier) or a wait on it."""
    events = incident.get("events", [])
    opened = epoch(incident.get("opened_at"))
    if opened is None:
        return 0.0
    total, last_end = 0.0, opened
    for event in events:
        at = epoch(event["at"]) or opened
        if event["kind"] in ("step_finished", "step_skipped", "approved"):
            last_end = max(last_end, at)
        elif event["kind"] == "step_started":
            total += max(0.0, at - last_end)
            last_end = at
    return total


def summary_lines(report: dict[str, Any], ground: ProvingGround) -> Iterator[str]:
    """The end of the demo, as text."""
    yield ""
    yield "Outcome"
    for line in report["verdict"]:
        yield f"  {line}"
    if report["stages"]:
        yield ""
        yield "Time to recovery by stage" if self_recovers(report) else "Time by stage"
        for name, a, b, whose in STAGES:
            if name in report["stages"]:
                yield f"  {name:<17} {report['stages'][name]:7.2f}s  {a} → {b}: {whose}"
        for key, words in (
            ("fault_to_job_running", "fault → job running again"),
            ("fault_to_job_progress", "fault → job past its checkpoint"),
            ("fault_to_closed", "fault → incident closed"),
        ):
            if report[key] is not None:
                yield f"  {words:<33} {report[key]:7.2f}s"
        if report["pitcrew_own_seconds"] is not None:
            yield (
                f"  pitcrew's own share: {report['pitcrew_own_seconds']:.3f}s (the rest is waiting on "
                "Prometheus, Alertmanager, Slurm and the replacement)"
            )
    gpu = report["gpu_hours_lost"]
    if gpu["job"] is not None:
        yield ""
        yield f"GPU-hours lost: {gpu['job']:.4f} by the job, {gpu['node_out_of_service'] or 0:.4f} of the node out of service"
        yield f"  ({gpu['how']})"
    yield ""
    if report["scenario"] == "storm":
        channel = report["channel"]
        yield (
            f"The Slack channel, as people read it ({channel['messages']} messages: "
            f"{channel['digest']} storm digest, {channel['breaker']} breaker notice)"
        )
    else:
        yield "The Slack thread, as people read it"
    for text in report["thread"]:
        for line in text.splitlines():
            yield f"  {line}"
    yield ""
    yield f"Logs and data: {report['workdir']}"
    store = ground.pitcrew.store if ground.pitcrew else "-"
    if ground.postgres is not None:  # a throwaway cluster: gone when the demo stops
        store = f"PostgreSQL on 127.0.0.1:{ground.postgres.port} (removed with the demo)"
    yield f"  pitcrew log {ground.pitcrew.log if ground.pitcrew else '-'}, store {store}"
    yield f"  Slurm logs {ground.slurm.run_dir / 'log'}, Prometheus {ground.workdir / 'prometheus'}, Alertmanager {ground.workdir / 'alertmanager'}"


def _result(incident: dict[str, Any], step: str) -> dict[str, Any]:
    """The recorded result of one of the incident's steps ({} until it has one)."""
    for record in incident.get("step_records") or []:
        if record.get("step") == step and isinstance(record.get("result"), dict):
            return dict(record["result"])
    return {}


def self_recovers(report: dict[str, Any]) -> bool:
    return report["fault_to_closed"] is not None or report["fault_to_job_running"] is not None


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds")


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)
