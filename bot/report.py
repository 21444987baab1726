"""Human and machine renderings for the CLI: dry-run plans, incidents, the catalog.

``dry_run`` is what ``pitcrew plan`` runs: the same planner and guards the engine uses,
fed from a payload file and (when it exists) the local store's history and switches,
with no far side contacted: the breaker's fleet is ``guards.breaker.fleet_size`` when
configured, else unknown (and its decision says so). Given the ports (``pitcrew plan --live``)
it also reads the capacity pools, read only, and says which node the ``capacity`` step would
take now and why, or why none: the step's own read and choice (``pool_views``, ``choose``).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from bot.config import CapacitySettings, Config
from bot.domain import guards, planner
from bot.domain.alerts import PayloadError, parse_webhook
from bot.domain.capacity import Choice, Taken, choose
from bot.domain.catalog import Catalog
from bot.domain.durations import format_duration
from bot.domain.faults import Fault
from bot.domain.goodput import Goodput
from bot.domain.guards import World
from bot.domain.incident import State
from bot.domain.trust import IncidentFacts, Offender, TrustRow
from bot.engine.admission import NOT_READ, build_world
from bot.engine.context import Ports
from bot.engine.errors import PermanentError, Reason, TransientError
from bot.engine.intake import to_delivery
from bot.engine.steps import REGISTRY, cost
from bot.engine.steps.capacity import need_of, pool_views, taken_elsewhere
from bot.store import codec
from bot.store.base import IncidentRecord, Store

_ALL_RESOLVED = "every alert for this node is resolved: recorded, and a resolved alert never starts an action"


async def dry_run(
    config: Config, body: bytes, now: datetime | None = None, *, ports: Ports | None = None
) -> list[dict[str, Any]]:
    try:
        payload = parse_webhook(body)
    except PayloadError as exc:
        raise ValueError(f"not an Alertmanager v4 webhook: {exc}") from None
    now = now or datetime.now(UTC)
    delivery = to_delivery(payload, config.catalog, config.labels)
    firing: dict[str, dict[str, Fault]] = defaultdict(dict)
    resolved: set[str] = set()
    unroutable = []
    for alert in delivery.alerts:
        if alert.node is None or alert.fault is None:
            unroutable.append(alert.alertname)
        elif alert.status == "firing":
            firing[alert.node].setdefault(alert.fault.key, alert.fault)
        else:
            resolved.add(alert.node)
    worlds = await _worlds(config, sorted(firing), now)
    out = []
    for node in sorted(set(firing) | resolved):
        if node not in firing:
            out.append(_no_action(node, config, _ALL_RESOLVED))
            continue
        world = worlds.get(node) or World(fleet=NOT_READ.fleet(config.policy.breaker.fleet_size))
        plan = planner.plan(
            node, list(firing[node].values()), world.history, config.policy, config.playbooks, now, REGISTRY
        )
        admitted = guards.evaluate(plan, world, config.policy, now).admit(plan)
        encoded: dict[str, Any] = dict(codec.encode_plan(admitted))
        if "capacity" in admitted.steps:
            encoded["capacity"] = capacity_words(config.settings.capacity)
            if ports is not None and config.settings.capacity.pools:
                choice, said = await capacity_now(config, ports, node)
                encoded["capacity"].append(said)
                encoded["capacity_choice"] = None if choice is None else _choice_record(choice)
        out.append(encoded)
    if unroutable:
        labels = ", ".join(config.labels.node)
        reason = (
            f"{len(unroutable)} alert(s) name no node (looked for labels {labels}): "
            f"{', '.join(sorted(set(unroutable)))}; recorded, never acted on"
        )
        out.append(_no_action(None, config, reason))
    return out


def capacity_words(settings: CapacitySettings) -> list[str]:
    """Where the ``capacity`` step would take a node from, in order, and under which guards (a dry run
    reads no pool: which member is taken is decided when the job is found pending)."""
    if not settings.pools:
        return ["no pool is configured: a job that needs every node of its partition waits for the repair"]
    out = []
    for index, pool in enumerate(settings.pools, 1):
        where = f"Slurm reservation {pool.reservation}" if pool.reservation else f"nodes {pool.selector}"
        guards_ = [f"min_idle {pool.min_idle}"]
        if pool.max_lend is not None:
            cap = f"{pool.max_lend:.0%} of the pool" if pool.max_lend < 1 else f"{int(pool.max_lend)}"
            guards_.append(f"max_lend {cap}")
        if pool.kind == "lender":
            guards_.append(f"its pods evicted within {format_duration(pool.evict_grace)}")
        out.append(f"{index}. {pool.kind} pool {pool.name} ({where}): {', '.join(guards_)}")
    out.append(
        "taken only if the interrupted job is pending for lack of nodes; never a node another incident "
        f"took, one with an open incident, the opt-out label, other GPUs or busy; give-back: {settings.give_back}"
    )
    return out


#: How long ``pitcrew plan --live`` waits for the pools (longer than the adapters' own timeouts).
LIVE_TIMEOUT = 45.0


def _unread(config: Config) -> list[str]:
    """The pools whose far side is not configured here (a dry-run journal reads nothing)."""
    integrations = config.settings.integrations
    out = []
    for pool in config.settings.capacity.pools:
        if pool.reservation is not None and integrations.scheduler != "slurm":
            out.append(f"pool {pool.name} needs integrations.scheduler: slurm")
        if pool.reservation is None and integrations.cluster != "kubernetes":
            out.append(f"pool {pool.name} needs integrations.cluster: kubernetes")
    return out


async def capacity_now(config: Config, ports: Ports, node: str) -> tuple[Choice | None, str]:
    """The node the ``capacity`` step would take now for a job stalled by ``node``, read only: the
    pools as the step reads them, the nodes open incidents took (from the local store, when there is
    one), and the step's choice. ``None`` with the reason when the pools cannot be read."""
    pools = config.settings.capacity.pools
    later = "the take is decided when the job is found pending"
    unread = _unread(config)
    if unread:
        return None, f"now: not read ({'; '.join(unread)}): {later}"
    try:
        async with asyncio.timeout(LIVE_TIMEOUT):
            taken, busy = await _taken(config)
            failed = (await ports.slurm_names(node) or (node,))[0]
            try:
                gpus = (await ports.scheduler.node(failed)).gpus
            except PermanentError as exc:
                if exc.reason != Reason.UNKNOWN_NODE:
                    raise
                gpus = None  # a node Slurm does not know: its GPU count does not refuse anything
            views = await pool_views(ports, pools, busy)
            need = await need_of(ports, pools, "dry-run", node, failed, gpus)
    except (TransientError, PermanentError, OSError, TimeoutError) as exc:
        return None, f"now: the pools could not be read ({exc or type(exc).__name__}): {later}"
    choice = choose(need, views, taken)
    if choice.node is None:
        return choice, f"now: would take none — {choice.why}"
    passed = "; ".join(
        f"{r.node if r.node != '*' else r.pool}: {r.guard} ({r.detail})" for r in choice.refused
    )
    return choice, f"now: would take {choice.why}" + (f"; passed over {passed}" if passed else "")


def _choice_record(choice: Choice) -> dict[str, Any]:
    return {
        "node": choice.node,
        "pool": choice.pool,
        "why": choice.why,
        "guards": list(choice.guards),
        "refused": [asdict(r) for r in choice.refused],
    }


async def _taken(config: Config) -> tuple[list[Taken], set[str]]:
    """What incidents in the local store took and hold (open ones', and ended ones' still out),
    and the open ones' nodes (nothing without a store)."""
    settings = config.settings.store
    if settings.url is None and not settings.path.exists():
        return [], set()
    from bot.store.factory import build_store

    store = build_store(settings)
    await store.open()
    try:
        return await taken_elsewhere(store, None)
    finally:
        await store.close()


def _no_action(node: str | None, config: Config, reason: str) -> dict[str, Any]:
    plan = planner.Plan(
        node or "", (), None, "none", config.policy.mode, (), "none", (reason,), allowed=False
    )
    return {**codec.encode_plan(plan), "node": node}


async def _worlds(config: Config, nodes: list[str], now: datetime) -> dict[str, World]:
    """Guard inputs from the local store when there is one (history, breaker, pause)."""
    settings = config.settings.store
    if not nodes or (settings.url is None and not settings.path.exists()):
        return {}
    from bot.store.factory import build_store

    store = build_store(settings)
    await store.open()
    try:
        out = {}
        for node in nodes:
            probe = IncidentRecord(
                id="dry-run", node=node, state=State.OPEN, opened_at=now, updated_at=now, first_alert_at=now
            )
            out[node] = await build_world(config.policy, store, probe, now, facts=None)
        return out
    finally:
        await store.close()


def render_plans(plans: list[dict[str, Any]]) -> str:
    lines = []
    for plan in plans:
        lines.append(f"node {plan['node'] or '(none)'}: {plan['playbook']} (mode {plan['mode']})")
        for fault in plan["faults"]:
            head = f"XID {fault['xid']}" if fault["xid"] is not None else fault["kind"]
            where = f" GPU {fault['gpu']}" if fault["gpu"] else ""
            lines.append(
                f"  fault  {head}{where}: {fault['meaning']} [bucket {fault['bucket'] or '-'}, "
                f"class {fault['class']}] → {fault['playbook']}"
            )
        if plan["steps"]:
            lines.append(f"  steps  {' → '.join(plan['steps'])}")
        for reason in plan["reasons"]:
            lines.append(f"  why    {reason}")
        for words in plan.get("capacity", ()):
            lines.append(f"  spare  {words}")
        for guard in plan["guards"]:
            mark = "ok " if guard["ok"] else "NO "
            lines.append(f"  guard  {mark}{guard['guard']}: {guard['words']}")
        if plan["guards"] and not plan["guards_enforced"]:
            lines.append("  guard  (not enforced: this plan changes nothing in its mode)")
        lines.append("")
    return "\n".join(lines).rstrip()


def render_incidents(incidents: list[dict[str, Any]]) -> str:
    if not incidents:
        return "no incidents"
    lines = [f"{'ID':<10} {'NODE':<20} {'STATE':<18} {'PLAYBOOK':<15} {'MODE':<8} OPENED"]
    for i in incidents:
        lines.append(
            f"{i['id']:<10} {i['node']:<20} {i['state']:<18} {i['playbook'] or '-':<15} "
            f"{i['mode'] or '-':<8} {i['opened_at']}"
        )
    return "\n".join(lines)


def render_detail(data: dict[str, Any]) -> str:
    lines = [
        f"{data['id']} on {data['node']}: {data['state']} — {data['playbook'] or 'not planned'} "
        f"(mode {data['mode'] or '-'})"
    ]
    if data["outcome"]:
        lines.append(f"outcome: {data['outcome']}")
    for fault in data["faults"]:
        lines.append(f"fault: {fault['key']} — {fault['meaning']} → {fault['playbook']}")
    if data["steps"]:
        lines.append(f"steps: {' → '.join(data['steps'])} (next: {data['next_step']})")
    for where, url in sorted(data.get("links", {}).items()):
        lines.append(f"{where} thread: {url}" if where == "slack" else f"{where}: {url}")
    if data.get("goodput"):
        lines += [
            "cost:",
            *(f"  {line}" for line in cost.lines(codec.decode_record(Goodput, data["goodput"]))),
        ]
    lines.append("timeline:")
    for event in data["events"]:
        what = " ".join(x for x in (event["kind"], event["step"] or "", event["outcome"] or "") if x)
        who = f" by {event['actor']}" if event["actor"] else ""
        lines.append(f"  {event['at']}  {what}{who}  {event['detail']}")
    return "\n".join(lines)


def catalog_rows(catalog: Catalog) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for code, entry in sorted(catalog.xids.items()):
        rows.append(
            {
                "xid": code,
                "fault": "xid",
                "mnemonic": entry.mnemonic,
                "meaning": entry.meaning,
                "bucket": entry.bucket,
                "class": entry.fault_class,
                "playbook": catalog.xid_playbook(code),
                "job_fatal": entry.job_fatal,
                "verified": entry.verified,
                "differs": catalog.differs(code),
            }
        )
    for name, fault in sorted(catalog.faults.items()):
        rows.append(
            {
                "xid": None,
                "fault": name,
                "mnemonic": None,
                "meaning": fault.meaning,
                "bucket": None,
                "class": fault.fault_class,
                "playbook": fault.playbook,
                "job_fatal": fault.job_fatal,
                "verified": True,
            }
        )
    return rows


async def trust_facts(store: Store, limit: int) -> list[IncidentFacts]:
    """The newest ``limit`` incidents as the trust ledger reads them (``bot.domain.trust``)."""
    facts = []
    for incident in await store.incidents(limit=limit):
        plan = incident.plan
        steps = await store.steps_of(incident.id)
        resumed = steps.get("slurm_resume")
        approval = await store.approval(incident.id) if incident.state is State.SUPPRESSED else None
        # A climb (or a replan) supersedes steps: only then are the events worth reading.
        climbed: tuple[str, ...] = ()
        if any(r.status == "superseded" for r in steps.values()):
            events = await store.events_of(incident.id)
            climbed = tuple(str(e.data.get("from")) for e in events if e.kind == "climbed")
        facts.append(
            IncidentFacts(
                incident_id=incident.id,
                node=incident.node,
                opened_at=incident.opened_at,
                playbook=incident.playbook or "none",
                fault_class=plan.decisive.fault_class if plan and plan.decisive else "unknown",
                fault_classes=frozenset(f.fault_class for f in incident.faults),
                remediates=bool(plan and plan.acts) and incident.state.terminal,
                rolled_back=incident.state is State.ROLLED_BACK,
                rejected=approval is not None and approval.status == "rejected",
                back_in_service=resumed is not None and resumed.status == "ok",
                acts=bool(plan and plan.acts),
                lemon=bool(plan and plan.lemon),
                climbed_from=climbed,
            )
        )
    return facts


def trust_rows(rows: list[TrustRow]) -> list[dict[str, Any]]:
    return [
        {**asdict(row), "overridden_rate": row.overridden_rate, "repeat_rate": row.repeat_rate}
        for row in rows
    ]


def offender_rows(found: list[Offender]) -> list[dict[str, Any]]:
    return [{**asdict(o), "last": o.last.isoformat()} for o in found]


def render_offenders(found: list[Offender], window: str) -> str:
    """The repeat offenders under the ledger; nothing when there are none."""
    if not found:
        return ""
    lines = [
        f"repeat offenders (remediations of any fault within {window}):",
        f"{'NODE':<24} {'LEMON':<5} INCIDENTS",
    ]
    lines += [f"{o.node:<24} {'yes' if o.lemon else 'no':<5} {', '.join(o.incidents)}" for o in found]
    return "\n".join(lines)


def render_trust(rows: list[TrustRow], window: str) -> str:
    if not rows:
        return "no remediation has ended yet"
    lines = [
        f"{'PLAYBOOK':<15} {'FAULT CLASS':<16} {'REMEDIATIONS':>12} {'ROLLED BACK':>11} {'REJECTED':>8} "
        f"{'OVERRIDDEN':>10} {'PASSED':>6} {'REPEAT':>6} {'REPEAT RATE':>11} {'CLIMBED':>7}"
    ]
    for r in rows:
        lines.append(
            f"{r.playbook:<15} {r.fault_class:<16} {r.remediations:>12} {r.rolled_back:>11} {r.rejected:>8} "
            f"{_percent(r.overridden_rate):>10} {r.passed:>6} {r.repeat:>6} {_percent(r.repeat_rate):>11} "
            f"{r.climbed:>7}"
        )
    lines.append(f"repeat: the same node back with the same fault class within {window}")
    lines.append("climbed: the rung's repair did not clear the fault; the incident climbed to the next rung")
    return "\n".join(lines)


def _percent(rate: float | None) -> str:
    return "-" if rate is None else f"{rate:.0%}"
