"""The ``scontrol`` backend of the scheduler port: Slurm's own commands, any Slurm version.

Runs ``scontrol``/``squeue`` as async subprocesses (argv only, never a shell) with a timeout
that kills the child, parses their ``-o`` one-line output (partitions into the records
``bot.integrations.slurm.json`` shares with the REST backend), and turns failures into
``TransientError`` (controller unreachable, timeouts) or ``PermanentError`` (unknown node or
job, invalid arguments). It must not retry (the engine's step executor does), decide
ownership (the ``slurm_resume`` step checks ``owns_slurm_reason`` before ``resume``) or log whole outputs.
"""

from __future__ import annotations

import asyncio
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from bot import logger
from bot.domain.goodput import gpus_in_gres, job_gpus
from bot.domain.jobs import JobSnapshot, SlurmNodeState, expand_hostlist
from bot.domain.ownership import clean_reason
from bot.engine.errors import PermanentError, PitcrewError, Reason, TransientError
from bot.engine.ports import PartitionNodes, Probe
from bot.integrations.slurm.json import Partition, member_partitions, requeue_refusal

log = logger(__name__)

_KEY = re.compile(r"(?:^|(?<=\s))([A-Z][A-Za-z0-9_:/]*)=")
# Slurm appends "[user@time]" to a node reason; it ends the reason even if the reason has "=".
_NODE_REASON = re.compile(r"(?:^|\s)Reason=(.*?) \[([^\s@\[\]]+)@(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\](?=\s|$)")
_NO_VALUE = frozenset({"", "(null)", "None", "N/A", "Unknown", "n/a"})
#: Reservation flags under which Slurm keeps the reservation's size by replacing nodes itself.
_REPLACING = frozenset({"REPLACE", "REPLACE_DOWN"})
_SHORT_STATE = {"*": "NOT_RESPONDING", "~": "POWERED_DOWN", "#": "POWERING_UP", "%": "POWERING_DOWN"}
_ACTIVE_STATES = "RUNNING,COMPLETING,CONFIGURING,SUSPENDED"
#: ``sinfo -O`` fields of one node, each ended by "|" and unpadded; the reason last (it may hold "|").
_SINFO_NODE = "NodeList:|,StateComplete:|,UserLong:|,TimeStamp:|,Gres:|,Reason:|"
#: Nodes a list left out that are read alone at once (``unlisted_nodes``): one ``sinfo`` each.
_ALONE_AT_ONCE = 8
#: The Slurm release whose lists hide no node (SchedMD's "Change cloud nodes to show by default").
_LISTS_SHOW_EVERY_NODE = (23, 2)
# One node, never a hostlist ("gpu-[001-100]" would down a hundred) nor something scontrol reads as
# an option; job ids are numbers, array tasks "123_4".
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_JOB_ID = re.compile(r"[0-9]{1,12}(_[0-9]{1,9})?")

# (pattern in stderr, transient?, reason): first match wins; Slurm's own words stay in the
# message. Unknown failures are permanent (``refused``): a human looks at them rather than
# pitcrew hammering a controller it does not understand.
_FAILURES: tuple[tuple[re.Pattern[str], bool, Reason], ...] = tuple(
    (re.compile(p, re.IGNORECASE), transient, reason)
    for p, transient, reason in (
        (
            r"unable to contact slurm controller|connection refused|zero bytes were transmitted",
            True,
            Reason.UNREACHABLE,
        ),
        (r"socket timed out|timed out|timeout", True, Reason.TIMEOUT),
        (r"temporarily|try again|busy", True, Reason.UNAVAILABLE),
        # slurmctld's HA takeover: a backup not in control yet (ESLURM_IN_STANDBY_MODE, 2027;
        # ESLURM_IN_STANDBY_USE_BACKUP, 2131), once the commands' own retry gave up on it.
        (r"standby mode", True, Reason.UNAVAILABLE),
        (r"invalid node name|node \S+ not found", False, Reason.UNKNOWN_NODE),
        (r"invalid job id", False, Reason.UNKNOWN_JOB),
        (r"access.*denied|permission denied|not authorized|authentication", False, Reason.FORBIDDEN),
        (r"invalid|request denied|must specify|unrecognized|usage", False, Reason.INVALID_REQUEST),
    )
)


def checked_node(name: str) -> str:
    """``name`` if it names exactly one Slurm node; else ``PermanentError(invalid_request)``."""
    if not _NODE_NAME.fullmatch(name) or name.upper() == "ALL":
        raise PermanentError(f"not a single Slurm node name: {name[:64]!r}", reason=Reason.INVALID_REQUEST)
    return name


#: Signals a playbook may send a job (``scancel --signal``): the ones training frameworks hook for
#: "checkpoint now", never one that ends the job.
JOB_SIGNALS = frozenset({"USR1", "USR2", "HUP", "CONT", "URG"})


def checked_signal(signal: str) -> str:
    if signal not in JOB_SIGNALS:
        raise PermanentError(
            f"signal {signal[:16]!r} is not one pitcrew sends a job ({', '.join(sorted(JOB_SIGNALS))})",
            reason=Reason.INVALID_REQUEST,
        )
    return signal


def not_requeueable(job_id: str, meaning: str, said: str) -> PermanentError:
    """Slurm refused to requeue the job, and will again (``json.requeue_refusal``); it changed
    nothing, the job runs on. ``said``: Slurm's own words, kept."""
    return PermanentError(
        f"requeue: Slurm will not requeue job {job_id}: {meaning} (Slurm: {said})",
        reason=Reason.NOT_REQUEUEABLE,
    )


def checked_job(job_id: str) -> str:
    if not _JOB_ID.fullmatch(job_id):
        raise PermanentError(f"not a Slurm job id: {job_id[:64]!r}", reason=Reason.INVALID_REQUEST)
    return job_id


class NodeUpdates(ABC):
    """DOWN, DRAIN and RESUME, node updates the same for both backends: each says how it reads a
    node and how it updates one."""

    @abstractmethod
    async def node(self, name: str) -> SlurmNodeState: ...

    @abstractmethod
    async def _update_node(self, name: str, state: str, reason: str | None) -> None: ...

    async def down(self, name: str, reason: str) -> None:
        """DOWN, then DRAIN with the same reason: ``ReturnToService=2`` returns a DOWN node to
        service as soon as its slurmd registers again, whoever set it DOWN (``node_mgr.c``
        ``validate_node_specs``): after the reboot or replacement pitcrew asked for, before its
        validation. The DRAIN flag survives the registration, so only a RESUME gives the node
        back. Both updates are idempotent, so a retried ``down`` does them again harmlessly."""
        await self._update_node(name, "DOWN", reason)
        await self._update_node(name, "DRAIN", reason)

    async def drain(self, name: str, reason: str) -> None:
        await self._update_node(name, "DRAIN", reason)

    async def resume(self, name: str) -> None:
        """Slurm refuses RESUME of a node no longer DOWN or DRAIN; that means the wanted state
        holds (``SlurmNodeState.taken_out``), so it is success (a retried step stays harmless)."""
        try:
            await self._update_node(name, "RESUME", None)
        except PermanentError as exc:
            if exc.reason == Reason.UNKNOWN_NODE:
                raise
            node = await self.node(name)
            if node.taken_out:
                raise


class ScontrolScheduler(NodeUpdates):
    """``Scheduler`` over Slurm's command-line tools."""

    backend = "scontrol"

    def __init__(
        self,
        *,
        bin_dir: Path | None = None,
        command_timeout: float = 20.0,
        slurm_conf: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self._bin_dir = bin_dir
        self._timeout = command_timeout
        self._env = dict(os.environ if env is None else env)
        self._env["LC_ALL"] = "C"  # error texts are matched below; keep them in English
        #: Whether slurmctld's lists may hide nodes (``_lists_may_hide``), once known.
        self._may_hide: bool | None = None
        if slurm_conf is not None:
            self._env["SLURM_CONF"] = str(slurm_conf)

    async def node(self, name: str) -> SlurmNodeState:
        try:
            out = await self._run("scontrol", "show", "node", "-o", checked_node(name), op="show_node")
        except PermanentError as exc:
            if exc.reason != Reason.UNKNOWN_NODE:
                raise
            return await self._unlisted_node(name)
        for line in out.splitlines():
            if parse_kv(line).get("NodeName") == name:
                with _shape("show_node"):
                    return parse_node_line(line)
        return await self._unlisted_node(name)

    async def _unlisted_node(self, name: str) -> SlurmNodeState:
        """A node ``scontrol show node`` does not find, read alone. 22.05's scontrol reads every node
        (``scontrol_load_nodes``), and slurmctld leaves a powered-down ``State=CLOUD`` node out of
        that list unless ``PrivateData=cloud`` (``node_mgr.c`` ``_is_cloud_hidden``): power saving
        suspends the node pitcrew took out, and it would read as gone from Slurm. ``sinfo -n`` of one
        node asks for it alone (``slurm_load_node_single``), which slurmctld does not hide."""
        out = await self._run("sinfo", "-h", "-N", "-n", name, "-O", _SINFO_NODE, op="show_node")
        for line in out.splitlines():
            if line.split("|", 1)[0] == name:
                with _shape("show_node"):
                    return parse_sinfo_node_line(line)
        raise PermanentError(f"Slurm node {name!r} not found", reason=Reason.UNKNOWN_NODE)

    async def nodes(self) -> list[SlurmNodeState]:
        """Every node: the list, and the nodes 22.05's list hides (``unlisted_nodes``). ``--future``
        lists the ``State=FUTURE`` nodes too, so they are not taken for hidden ones and read alone:
        they do not exist yet, and are not returned."""
        out = await self._run("scontrol", "--all", "--future", "show", "node", "-o", op="show_nodes")
        with _shape("show_nodes"):
            listed = [parse_node_line(line) for line in out.splitlines() if line.startswith("NodeName=")]
        found = [n for n in listed if "FUTURE" not in n.states]
        return found + await self.unlisted_nodes({n.name for n in listed})

    async def unlisted_nodes(self, listed: Collection[str]) -> list[SlurmNodeState]:
        """The nodes of Slurm's partitions that a list of every node left out, each read alone
        (``_unlisted_node``). 22.05's slurmctld leaves a powered-down ``State=CLOUD`` node out of
        every list unless ``PrivateData=cloud`` (``node_mgr.c`` ``pack_all_node``, ``_is_cloud_hidden``;
        ``sinfo`` and slurmrestd's ``/nodes`` alike), not out of a partition's ``Nodes=``, and power
        saving suspends a DOWN or DRAIN node too: someone's outage vanished from the breaker's count.
        From 23.02 on a list shows them (SchedMD's "Change cloud nodes to show by default"), and
        this reads nothing (``_lists_may_hide``). A node neither read finds (one not in Slurm any more) is
        left out. A node in no partition, or only in ``Nodes=ALL`` ones, cannot be named here."""
        if not await self._lists_may_hide():
            return []
        # Nodes=ALL names no node: a node it hides stays unseen (the README says so).
        members = {n for p in await self._partitions() if not p.everything for n in expand_hostlist(p.nodes)}
        slots = asyncio.Semaphore(_ALONE_AT_ONCE)

        async def alone(name: str) -> SlurmNodeState:
            async with slots:
                return await self._unlisted_node(name)

        # Every read ends (each ``_run`` is bounded by the command timeout) before one failure is told.
        read = await asyncio.gather(
            *(alone(n) for n in sorted(members - set(listed))), return_exceptions=True
        )
        for outcome in read:
            if isinstance(outcome, PermanentError) and outcome.reason == Reason.UNKNOWN_NODE:
                continue
            if isinstance(outcome, BaseException):
                raise outcome
        return [n for n in read if isinstance(n, SlurmNodeState)]

    async def jobs_on_node(self, name: str) -> list[JobSnapshot]:
        # squeue's text mode honours -w (its --json mode ignores filters in 22.05); the
        # details, including the restart count, come from scontrol, one job at a time.
        argv = ("-h", "-w", checked_node(name), "-t", _ACTIVE_STATES, "-o", "%A")
        out = await self._run("squeue", *argv, op="squeue")
        jobs = []
        for job_id in dict.fromkeys(out.split()):
            job = await self.job(job_id)
            if job is not None and job.running and name in job.nodes:
                jobs.append(job)
        return jobs

    async def job(self, job_id: str) -> JobSnapshot | None:
        try:
            out = await self._run("scontrol", "show", "job", "-o", checked_job(job_id), op="show_job")
        except PermanentError as exc:
            if exc.reason == Reason.UNKNOWN_JOB:
                return None
            raise
        lines = [line for line in out.splitlines() if line.startswith("JobId=")]
        exact = [line for line in lines if parse_kv(line).get("JobId") == job_id]
        with _shape("show_job"):
            return parse_job_line((exact or lines)[0]) if lines else None

    async def _lists_may_hide(self) -> bool:
        """Whether slurmctld's lists may leave a node out (22.05 and before, ``unlisted_nodes``), told
        by this scontrol's version, read once (``scontrol --version``, no RPC): Slurm's upgrade order
        puts slurmctld before the commands (upgrades.html), so the controller is at least as new,
        and from 23.02 on lists show every node. A version that cannot be read: they may."""
        if self._may_hide is None:
            try:
                out = await self._run("scontrol", "--version", op="version")
            except PitcrewError:
                return True  # asked again next time
            version = re.search(r"(\d+)\.(\d+)", out)
            self._may_hide = version is None or (int(version[1]), int(version[2])) < _LISTS_SHOW_EVERY_NODE
        return self._may_hide

    async def partition_nodes(self, name: str) -> PartitionNodes | None:
        node = checked_node(name)
        return member_partitions(await self._partitions(), node)

    async def _partitions(self) -> list[Partition]:
        # --all: a hidden partition holds its nodes as much as a visible one.
        out = await self._run("scontrol", "--all", "--oneliner", "show", "partition", op="show_partition")
        with _shape("show_partition"):
            return [parse_partition_line(ln) for ln in out.splitlines() if ln.startswith("PartitionName=")]

    async def reservation(self, name: str) -> tuple[str, ...] | None:
        try:
            out = await self._run(
                "scontrol", "show", "reservation", "-o", checked_node(name), op="show_reservation"
            )
        except PermanentError as exc:
            if "not found" in str(exc).lower():
                return None
            raise
        for line in out.splitlines():
            kv = parse_kv(line)
            if kv.get("ReservationName") == name:
                replacing = _REPLACING & set(kv.get("Flags", "").split(","))
                if replacing:
                    # Slurm refuses its every change of nodes (update_resv: "Reservation can't be
                    # updated with Nodes option; it is incompatible with REPLACE[_DOWN]"), and it
                    # refills itself: said before a take, not in its middle.
                    raise PermanentError(
                        f"reservation {name} has flag {'/'.join(sorted(replacing))}: Slurm keeps its size "
                        "itself and refuses any change of its nodes, so it cannot be a pool; remove the flag",
                        reason=Reason.MISCONFIGURED,
                    )
                nodes = kv.get("Nodes", "")
                return expand_hostlist("" if nodes in _NO_VALUE else nodes)
        return None

    async def set_reservation_nodes(self, name: str, nodes: Sequence[str]) -> None:
        # Slurm 22.05 refuses Nodes+=/-= on a reservation: the whole list is written.
        listed = ",".join(checked_node(n) for n in nodes)
        if not listed:
            raise PermanentError(
                f"reservation {name}: Slurm cannot empty a reservation", reason=Reason.REFUSED
            )
        await self._run(
            "scontrol",
            "update",
            f"ReservationName={checked_node(name)}",
            f"Nodes={listed}",
            op="update_reservation",
        )
        log.info("slurm reservation updated", extra={"reservation": name, "nodes": listed})

    async def requeue(self, job_id: str) -> None:
        try:
            await self._run("scontrol", "requeue", checked_job(job_id), op="requeue")
        except PermanentError as exc:
            said = str(exc).removeprefix("requeue: ")
            if "pending execution" in said.lower():
                return  # already back in the queue: requeue is done
            meaning = requeue_refusal(said)
            if meaning is not None:
                raise not_requeueable(job_id, meaning, said) from exc
            raise

    async def signal_job(self, job_id: str, signal: str) -> None:
        """``scancel --signal=<sig> --batch <job>``: the batch step only (the training launcher)."""
        argv = (f"--signal={checked_signal(signal)}", "--batch", checked_job(job_id))
        await self._run("scancel", *argv, op="signal_job")

    async def aclose(self) -> None:
        """Nothing to release; present so both backends close the same way."""

    async def probe(self) -> Probe:
        """``scontrol show partition``: slurmctld answers us through munge. Changes nothing."""
        try:
            names = [p.name for p in await self._partitions()]
        except PitcrewError as exc:
            return Probe("slurm", False, f"scontrol: {exc}", missing=(probe_missing(exc, "scontrol"),))
        return Probe("slurm", True, f"scontrol: slurmctld answers; partitions: {', '.join(names) or 'none'}")

    async def _update_node(self, name: str, state: str, reason: str | None) -> None:
        args = ["update", f"NodeName={checked_node(name)}", f"State={state}"]
        if reason is not None:
            # One argv element: spaces stay inside the reason, no shell ever sees it.
            args.append(f"Reason={clean_reason(reason) or 'pitcrew'}")
        await self._run("scontrol", *args, op=f"node_{state.lower()}")
        log.info("slurm node updated", extra={"slurm_node": name, "state": state, "backend": "scontrol"})

    async def _run(self, program: str, *args: str, op: str) -> str:
        exe = str(self._bin_dir / program) if self._bin_dir else program
        try:
            proc = await asyncio.create_subprocess_exec(
                exe,
                *args,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self._env,
            )
        except FileNotFoundError as exc:
            raise PermanentError(f"{op}: {program} not found", reason=Reason.MISCONFIGURED) from exc
        try:
            async with asyncio.timeout(self._timeout):
                out, err = await proc.communicate()
        except TimeoutError as exc:
            raise TransientError(
                f"{op}: {program} gave no answer in {self._timeout:g}s", reason=Reason.TIMEOUT
            ) from exc
        finally:  # timed out, or the step cancelled: the program does not outlive its call
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        stdout, stderr = out.decode(errors="replace"), err.decode(errors="replace")
        if proc.returncode != 0:
            raise classify_failure(op, stderr or stdout)
        return stdout


@contextmanager
def _shape(op: str) -> Iterator[None]:
    """Output that does not parse is a permanent error (a Slurm we do not understand), not a crash."""
    try:
        yield
    except (KeyError, ValueError) as exc:
        raise PermanentError(
            f"{op}: unexpected output ({type(exc).__name__})", reason=Reason.BAD_RESPONSE
        ) from exc


def classify_failure(op: str, text: str) -> PitcrewError:
    """Map a failed command's message to a port error with a bounded reason."""
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "no output")[:200]
    for pattern, transient, reason in _FAILURES:
        if pattern.search(text):
            cls = TransientError if transient else PermanentError
            return cls(f"{op}: {first}", reason=reason)
    return PermanentError(f"{op}: {first}", reason=Reason.REFUSED)


def probe_missing(exc: PitcrewError, via: str) -> str:
    """What an installer must provide when a Slurm read failed (``Probe.missing``)."""
    unreadable = isinstance(exc, TransientError) and exc.reason == Reason.BAD_RESPONSE
    if via == "slurmrestd" and (unreadable or exc.reason in (Reason.UNREACHABLE, Reason.UNAVAILABLE)):
        # 22.05's slurmrestd answers 500 "Unspecified error" alike for a lost slurmctld and a bad
        # token; 26.05.5's answers no error readably (``rest.UnreadableAnswer``), a refused token's either.
        return "slurmctld reachable through slurmrestd, with a token it accepts (slurm.rest_token_file)"
    return {
        Reason.MISCONFIGURED: f"{via} on PATH (slurm.bin_dir; the image's scontrol target)",
        Reason.UNREACHABLE: f"slurmctld reachable through {via}",
        Reason.TIMEOUT: f"slurmctld answering {via} in time",
        Reason.FORBIDDEN: f"Slurm permission for {via}",
        Reason.UNAUTHORIZED: "a slurmrestd token it accepts (slurm.rest_token_file)",
        Reason.NO_CREDENTIALS: "a readable slurm.rest_token_file",
    }.get(exc.reason, f"slurm ({exc.reason})")


def parse_kv(line: str) -> dict[str, str]:
    """``Key=value`` pairs of one ``scontrol show -o`` line; values may contain spaces."""
    fields: dict[str, str] = {}
    reason = _NODE_REASON.search(line)
    if reason:
        fields["Reason"], fields["_ReasonUser"], fields["_ReasonTime"] = reason.groups()
        line = line[: reason.start()] + line[reason.end() :]
    matches = list(_KEY.finditer(line))
    for here, after in zip(matches, [*matches[1:], None], strict=True):
        end = after.start() if after else len(line)
        fields.setdefault(here.group(1), line[here.end() : end].strip())
    return fields


def parse_node_line(line: str) -> SlurmNodeState:
    """One ``scontrol show node -o`` line."""
    kv = parse_kv(line)
    states: set[str] = set()
    for part in kv.get("State", "UNKNOWN").split("+"):
        base = part.rstrip("*~#%$@!^-")
        states.add(base.upper())
        states.update(_SHORT_STATE[s] for s in part[len(base) :] if s in _SHORT_STATE)
    reason = kv.get("Reason", "")
    return SlurmNodeState(
        name=kv["NodeName"],
        states=frozenset(states),
        reason="" if reason in {"(null)", "None"} else reason,
        reason_user=kv.get("_ReasonUser"),
        reason_time=_local_time(kv.get("_ReasonTime", "")),
        slurmd_started_at=_local_time(kv.get("SlurmdStartTime", "")),
        gpus=gpus_in_gres(kv.get("Gres")),
    )


def parse_sinfo_node_line(line: str) -> SlurmNodeState:
    """One ``sinfo -h -N -O`` line of ``_SINFO_NODE``'s fields (no slurmd start time there)."""
    name, state, user, stamp, gres, reason = line.split("|", 5)
    reason = reason.removesuffix("|").strip()
    reason = "" if reason in _NO_VALUE or reason.lower() == "none" else reason
    return SlurmNodeState(
        name=name,
        states=frozenset(s.upper() for s in state.strip().split("+") if s),
        reason=reason,
        reason_user=(user.split("(", 1)[0] or None) if reason else None,
        reason_time=_local_time(stamp.strip()) if reason else None,
        gpus=gpus_in_gres(gres.strip()),
    )


def parse_partition_line(line: str) -> Partition:
    """One ``scontrol show partition -o`` line."""
    kv = parse_kv(line)
    total = kv.get("TotalNodes", "")
    return Partition(kv["PartitionName"], kv.get("Nodes", ""), int(total) if total.isdigit() else None)


def parse_job_line(line: str) -> JobSnapshot:
    """One ``scontrol show job -o`` line."""
    kv = parse_kv(line)
    reason = kv.get("Reason", "")
    return JobSnapshot(
        job_id=kv["JobId"],
        name=kv.get("JobName", ""),
        user=kv.get("UserId", "").split("(", 1)[0],
        state=kv.get("JobState", "UNKNOWN").upper(),
        nodes=expand_hostlist(kv.get("NodeList", "")),
        restarts=int(kv.get("Restarts", "0") or 0),
        requeue=kv.get("Requeue", "1") == "1",
        batch=kv.get("BatchFlag", "1") != "0",
        reason="" if reason in _NO_VALUE else reason,
        start_time=_local_time(kv.get("StartTime", "")),
        gpus=job_gpus(kv.get("TresPerNode"), kv.get("NumNodes"), kv.get("AllocTRES") or kv.get("TRES")),
    )


def _local_time(text: str) -> datetime | None:
    # scontrol prints the controller host's local time without a zone.
    if text in _NO_VALUE:
        return None
    try:
        return datetime.fromisoformat(text).astimezone(UTC)
    except ValueError:
        return None
