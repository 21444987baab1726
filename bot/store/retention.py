"""Retention: a store that stays small for years (``store.retention``, default 180 days).

What goes, once it is older than the cut-off:

* a **closed** incident (a terminal state, ``closed_at`` before the cut-off) with its alerts and
  their delivery counters, what they said in its timeline, its step records, approvals, delivered
  outbox rows and the references destinations kept for it (``thread:``, ``parent:``, ``region:``…
  ``<what>:<incident>``, every ``bot.store.base.INCIDENT_REFS``);
* an alert filed under no incident (no node label) last delivered before the cut-off, and what
  such alerts said before it;
* a delivered outbox row of no incident, delivered before the cut-off.

What never goes: an incident that is not closed; an incident with an outbox row not yet
delivered (its notice still has to leave; it goes once delivered); the newest incident, whose
number the next one counts on (incident ids are never reused, so the kept audit log never speaks
of two incidents under one name); and the audit log: every event of the timeline but what an
alert said (``audit``; ``bot.store.ingest.ALERT_EVENTS``), so every destructive action pitcrew
took, every command and decision, kept whole. What the alerts of a pruned incident said
(``alert_firing``…, one event at least an alert: most of the timeline) goes with them, and what
alerts of no incident said once older than the cut-off; the database refuses any other delete.

A prune runs in bounded transactions (``prune_batch``: at most ``BATCH`` alerts and
``INCIDENTS`` incidents each) that take turns with the store's other writes (``SqlStore.prune``).
On SQLite each waits until the writes queued before it have committed, then runs on the event loop
and commits without an fsync of its own (``bot.store.writer.Redoable``: a prune lost in a power cut
is done again); on Postgres they run beside the other writes, without the write lock
(``PostgresStore._prune_transact``). Each is sized by how long the previous one's statements took
(``BUDGET``, ``SHARED_BUDGET`` on SQLite: halved when longer, doubled when under half of it) and is
followed by a pause ``PACE`` times as long as the whole write took (``BESIDE_PACE`` on Postgres),
so webhooks never wait long and never for most of the time. What one transaction costs is its
commit more than its deletes (an fsync on Postgres), hence a budget on the statements' own time:
a slow disk does not starve the prune down to a few alerts per commit. Each transaction is fenced
like every engine write, so only the leader prunes. Written once for both stores (``bot.store.sql``); the query that finds closed
incidents reads them oldest first by ``incidents_closed`` (``{by_closed_at}``),
whatever the number of incidents kept.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from datetime import datetime

from bot.store.base import INCIDENT_REFS, incident_ref
from bot.store.codec import ts
from bot.store.sql import Op, many, rows, run

#: Most alerts (and as many delivery counters) one prune transaction removes.
BATCH = 200
#: Most incidents one prune transaction removes.
INCIDENTS = 10
#: After each transaction a prune waits this many times as long as it took, commit included: the
#: writer is free for webhooks at least three quarters of the time, however slow the disk. An
#: alert's keys are hashes, so each alert deleted dirties a page of its own in two tables: a
#: prune's pages, written to the WAL and checkpointed into the database, are what slows the
#: webhooks' commits (at 1.0, a 1,000,000-alert prune put ingest's p99 at 7x).
PACE = 3.0
#: ``PACE`` where the prune runs beside the deliveries (Postgres): its transactions are sized and
#: paced by how long they took, and since the store's writes run on the event loop (no thread
#: handing the interpreter over between statements) they take less time for the same rows, so at
#: ``PACE`` a 1,000,000-alert prune went 19 % faster (428 s against 509 s) and put ingest's p99 at
#: 2.15x what it was alone (3.36 ms against 1.56 ms). Its pages in the WAL are what slow the
#: webhooks' commits: a prune a sixth of the time writes fewer of them a second (1.79x, 3.16 ms
#: against 1.76 ms alone, the prune 820 s).
BESIDE_PACE = 5.0
#: How long one prune transaction's statements should take: a batch whose statements took longer
#: halves the next one (down to ``MIN_BATCH`` alerts), one under half of it doubles the next (up to
#: ``BATCH``).
BUDGET = 0.005
#: ``BUDGET`` where the prune shares the store's one writer with the deliveries (SQLite): a delivery
#: that comes while a prune transaction runs waits for all of it, commit included. At 5 ms,
#: ``bench/retention.py`` on a quiet machine (deliveries about 1 ms at p99 alone) put ingest's p99
#: while pruning 100,000 alerts at 8-12x; at 0.5 ms, 2.5x, with the prune four times as long. What
#: was left was the transaction's fixed cost in the writer's thread (its fsync, its hand-overs: 1.3
#: ms at the median for 0.2-0.3 ms of statements; smaller budgets gained nothing), gone since it
#: runs on the loop and commits without an fsync (``bot.store.writer.Redoable``): 1.3-1.4x.
SHARED_BUDGET = 0.0005
MIN_BATCH = 10
#: Longest a prune transaction waits for the writes queued before it (a storm's deliveries) to
#: commit; then it takes its turn anyway, so a long storm delays a prune but never stops it.
YIELD = 1.0
TABLES = ("incidents", "alerts", "alert_deliveries", "events", "steps", "approvals", "outbox", "outbox_refs")


@dataclass(slots=True)
class Pruned:
    """Rows removed, by table; the alert keys removed; whether rows past the cut-off are left;
    how long the statements took (seconds, one transaction's: what ``BUDGET`` is checked against)."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TABLES, 0))
    keys: list[tuple[str, str]] = field(default_factory=list)
    more: bool = False
    took: float = 0.0

    def add(self, other: Pruned) -> None:
        for table, n in other.counts.items():
            self.counts[table] += n
        self.keys.extend(other.keys)
        self.took += other.took

    @property
    def total(self) -> int:
        return sum(self.counts.values())


_ELIGIBLE = (
    "SELECT id FROM incidents i {by_closed_at} WHERE closed_at IS NOT NULL AND closed_at < ? AND state IN {terminal}"
    " AND seq < (SELECT MAX(seq) FROM incidents)"
    " AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.incident_id = i.id AND o.delivered_at IS NULL)"
    " ORDER BY closed_at LIMIT ?"
)


def prune_batch(before: datetime, batch: int = BATCH) -> Op[Pruned]:
    """One bounded transaction of pruning (see the module's docstring), timed."""
    started = time.monotonic()
    done = yield from _prune_batch(before, batch)
    done.took = time.monotonic() - started
    return done


def _prune_batch(before: datetime, batch: int) -> Op[Pruned]:
    cutoff = ts(before)
    done = Pruned()
    found = yield rows(_ELIGIBLE, (cutoff, INCIDENTS))
    ids = [r["id"] for r in found]
    if ids:
        # What the alerts said of these incidents, ``batch`` events at a time, as their alerts go
        # below; the rest of their timeline is the audit log, kept (``audit``: the database
        # refuses to delete it, or anything of an incident not closed).
        told = yield rows(
            "SELECT incident_id, seq FROM events WHERE incident_id IN (?*) AND audit = 0"
            " ORDER BY incident_id, seq LIMIT ?",
            [ids, batch],
        )
        if told:
            done.counts["events"] = yield run(
                "DELETE FROM events WHERE incident_id IN (?*) AND audit = 0 AND (incident_id, seq) <= (?, ?)",
                [ids, told[-1]["incident_id"], told[-1]["seq"]],
            )
        if len(told) == batch:
            done.more = True  # the incidents go in a later batch, once what their alerts said is gone
            return done
        # The first ``batch`` alerts of these incidents in the index's order (ordered, so that both
        # planners read the index rather than the table), then every alert up to the last of them:
        # set-based deletes, a statement a table, not one per alert.
        keys = yield rows(
            "SELECT incident_id, fingerprint, starts_at FROM alerts WHERE incident_id IN (?*)"
            " ORDER BY incident_id, fingerprint, starts_at LIMIT ?",
            [ids, batch],
        )
        if keys:
            last = keys[-1]
            gone = yield rows(
                "DELETE FROM alerts WHERE incident_id IN (?*)"
                " AND (incident_id, fingerprint, starts_at) <= (?, ?, ?) RETURNING fingerprint, starts_at",
                [ids, last["incident_id"], last["fingerprint"], last["starts_at"]],
            )
            yield from _drop_counters(done, [(k["fingerprint"], k["starts_at"]) for k in gone])
        if len(keys) == batch:
            done.more = True  # the incidents go in a later batch, once their alerts are gone
            return done
        for table in ("steps", "approvals"):
            done.counts[table] = yield run(f"DELETE FROM {table} WHERE incident_id IN (?*)", [ids])  # noqa: S608
        # Delivered rows only: found above to be all there are, and a notice queued since (a
        # Postgres prune runs beside the other writes) is never thrown away unsent.
        done.counts["outbox"] = yield run(
            "DELETE FROM outbox WHERE incident_id IN (?*) AND delivered_at IS NOT NULL", [ids]
        )
        done.counts["outbox_refs"] = yield run("DELETE FROM outbox_refs WHERE key IN (?*)", [_ref_keys(ids)])
        done.counts["incidents"] = yield run("DELETE FROM incidents WHERE id IN (?*)", [ids])
        done.more = len(ids) == INCIDENTS
    lone = yield rows(
        "SELECT a.fingerprint, a.starts_at FROM alerts a JOIN alert_deliveries d"
        " ON d.fingerprint = a.fingerprint AND d.starts_at = a.starts_at"
        " WHERE a.incident_id IS NULL AND d.last_seen < ? LIMIT ?",
        (cutoff, batch),
    )
    yield from _drop_alerts(done, [(k["fingerprint"], k["starts_at"]) for k in lone])
    # What alerts of no incident said, oldest first, up to the first told after the cut-off.
    said = yield rows(
        "SELECT seq, at FROM events WHERE incident_id IS NULL AND audit = 0 ORDER BY seq LIMIT ?", (batch,)
    )
    old = [r["seq"] for r in itertools.takewhile(lambda r: r["at"] < cutoff, said)]
    if old:
        done.counts["events"] += yield run(
            "DELETE FROM events WHERE incident_id IS NULL AND audit = 0 AND seq <= ?", (old[-1],)
        )
    sent = yield run(
        "DELETE FROM outbox WHERE id IN (SELECT id FROM outbox WHERE incident_id IS NULL"
        " AND delivered_at IS NOT NULL AND delivered_at < ? ORDER BY id LIMIT ?)",
        (cutoff, batch),
    )
    done.counts["outbox"] += sent
    done.more = done.more or len(lone) == batch or sent == batch or len(old) == batch
    return done


def _ref_keys(ids: list[str]) -> list[str]:
    """The keys destinations keep references of these incidents under (``INCIDENT_REFS``)."""
    return [incident_ref(what, i) for i in ids for what in INCIDENT_REFS]


def _drop_alerts(done: Pruned, keys: list[tuple[str, str]]) -> Op[None]:
    if keys:
        yield many("DELETE FROM alerts WHERE fingerprint = ? AND starts_at = ?", keys)
    yield from _drop_counters(done, keys)


def _drop_counters(done: Pruned, keys: list[tuple[str, str]]) -> Op[None]:
    """The delivery counters of alerts just deleted: those of these fingerprints left without an
    alert (another firing of the same alert, another ``startsAt``, keeps its counter)."""
    if keys:
        done.counts["alert_deliveries"] += yield run(
            "DELETE FROM alert_deliveries WHERE fingerprint IN (?*) AND NOT EXISTS (SELECT 1 FROM alerts a"
            " WHERE a.fingerprint = alert_deliveries.fingerprint AND a.starts_at = alert_deliveries.starts_at)",
            [sorted({fingerprint for fingerprint, _ in keys})],
        )
    done.counts["alerts"] += len(keys)
    done.keys.extend(keys)
