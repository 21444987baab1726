"""The slurmrestd backend of the scheduler port (aiohttp, JWT).

Reads nodes, jobs and partitions over REST on v0.0.38+ and updates nodes over REST where the
server's OpenAPI document offers it (v0.0.39+, Slurm 23.02+), and requeues jobs over REST where
it offers that (v0.0.45+, Slurm 26.05+: a ``GET``, fenced as a change); otherwise it hands over
to the ``scontrol`` backend. It owns one ClientSession per instance and the JWT read from a file (re-read when the file changes). It
must not retry beyond one re-read of a changed token, and never puts the token or a whole
payload in a log line or an exception message.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp

from bot import logger
from bot.domain.jobs import JobSnapshot, SlurmNodeState
from bot.domain.ownership import clean_reason, is_pitcrew_reason
from bot.engine.errors import PermanentError, PitcrewError, Reason, TransientError
from bot.engine.ports import PartitionNodes, Probe
from bot.integrations.fenced import CHANGES, traces
from bot.integrations.slurm.cli import (
    NodeUpdates,
    ScontrolScheduler,
    checked_job,
    checked_node,
    not_requeueable,
    probe_missing,
)
from bot.integrations.slurm.json import (
    RestApi,
    SlurmError,
    discover_api,
    errors_of,
    job_from_json,
    jobs_from_payload,
    jobs_running_on,
    member_partitions,
    node_from_json,
    nodes_from_payload,
    partitions_from_payload,
)
from bot.store.lease import Fence

log = logger(__name__)

_OPENAPI_PATHS = ("/openapi/v3", "/openapi")


@contextmanager
def _shape(op: str) -> Iterator[None]:
    """A response that does not have the documented shape is a permanent error, not a crash."""
    try:
        yield
    except (KeyError, TypeError, ValueError) as exc:
        raise PermanentError(
            f"{op}: unexpected response shape ({type(exc).__name__})", reason=Reason.BAD_RESPONSE
        ) from exc


class _TokenFile:
    """The JWT in a file (bare, or ``SLURM_JWT=…`` as ``scontrol token`` prints it)."""

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._stamp: tuple[int, int] | None = None
        self._token = ""

    def get(self) -> str:
        if self._path is None:
            return ""
        try:
            st = os.stat(self._path)
        except OSError as exc:
            raise PermanentError("slurmrestd token file is unreadable", reason=Reason.NO_CREDENTIALS) from exc
        if (st.st_mtime_ns, st.st_size) != self._stamp:
            text = self._path.read_text().strip()
            self._token = text.split("=", 1)[1] if text.startswith("SLURM_JWT=") else text
            self._stamp = (st.st_mtime_ns, st.st_size)
        return self._token

    def changed(self) -> bool:
        before = self._token
        return self.get() != before


class UnreadableAnswer(TransientError):
    """slurmrestd answered something no HTTP client can read as one answer. 26.05.5 does so for
    every error (``tests/fixtures/slurm/26.05/rest/v0.0.45/wire``): its JSON answer, with
    ``Connection: Close``, is followed on the same connection by a second answer, ``text/plain``,
    with the error's text, which aiohttp refuses ("Data after `Connection: close`"), so which error
    it was is lost. A change whose answer is lost this way is read back: a node update holds or not
    (``_holds``), a requeue left the job waiting or Slurm does not know it; a read whose answer is
    lost stays a transient error, but ``job`` looks a job Slurm forgot up in the jobs it lists.
    (A token slurmctld refuses is lost the same way: the request goes again at once if the token
    file changed meanwhile, as after a refusal read; else a transient error.)"""


def _refused(status: int, errors: Sequence[SlurmError]) -> bool:
    """slurmrestd or slurmctld refused the token: 401/403 (a missing or malformed header), 511
    (24.05.5+: slurmctld refused the credential), or that refusal's error in any answer (23.11: 500)."""
    return status in (401, 403, 511) or any(e.refused_credential for e in errors)


def _holds(node: SlurmNodeState, state: str, reason: str | None) -> bool:
    """Whether ``node`` is as an update to ``state`` with ``reason`` leaves it: RESUME no longer
    DOWN or DRAIN (``SlurmNodeState.taken_out``, as ``NodeUpdates.resume`` takes a refused RESUME
    whose answer was read); DOWN or DRAIN with that reason, pitcrew's, so a node someone else took
    out of service is never read as pitcrew's doing."""
    if state == "RESUME":
        return not node.taken_out
    taken = node.down if state == "DOWN" else node.drained
    return taken and node.reason == reason


def _down_unshown(node: SlurmNodeState) -> bool:
    """A node 22.05's slurmrestd (v0.0.38) lists busy and in service though it is DOWN, its jobs
    being killed: someone else's reason on a busy node says so. Not on an idle node (a RESUME may
    keep the last reason until a job lands there), nor on one waiting for a reboot: ``scontrol
    reboot`` (no ASAP) leaves a busy node to its jobs, REBOOT_REQUESTED, with a reason of its own
    ("reboot requested" or the request's: ``proc_req.c`` ``_slurm_rpc_reboot_nodes``)."""
    return (
        bool(node.reason)
        and node.in_service
        and node.busy
        and "REBOOT_REQUESTED" not in node.states
        and not is_pitcrew_reason(node.reason)
    )


class RestScheduler(NodeUpdates):
    """``Scheduler`` over slurmrestd; node updates fall back to ``fallback`` when needed."""

    backend = "rest"

    def __init__(
        self,
        *,
        url: str,
        user: str,
        token_file: Path | None,
        fallback: ScontrolScheduler,
        api_version: str = "auto",
        request_timeout: float = 10.0,
        fence: Fence | None = None,
    ) -> None:
        self._url = url.rstrip("/")
        #: ``pitcrew serve``'s: every request that changes Slurm asks it last, once its connection
        #: is held (``bot.integrations.fenced``); updates made through ``fallback`` (scontrol) are
        #: checked by the engine's gated port only.
        self._fence = fence
        self._user = user
        self._token = _TokenFile(token_file)
        self._fallback = fallback
        self._pinned = api_version
        self._timeout = aiohttp.ClientTimeout(total=request_timeout)
        self._session: aiohttp.ClientSession | None = None
        self._api: RestApi | None = None

    async def api(self) -> RestApi:
        """The API version in use and whether node updates go over REST (discovered once)."""
        if self._api is None:
            document: Mapping[str, Any] | None = None
            for path in _OPENAPI_PATHS:
                status, body = await self._request("GET", path, op="openapi", allow={404})
                if status != 404:
                    document = body
                    break
            if document is None:
                raise PermanentError("slurmrestd serves no OpenAPI document", reason=Reason.UNSUPPORTED)
            try:
                self._api = discover_api(document, self._pinned)
            except ValueError as exc:
                raise PermanentError(f"slurmrestd API unusable: {exc}", reason=Reason.UNSUPPORTED) from exc
            log.info(
                "slurmrestd api discovered",
                extra={"api_version": self._api.version, "node_update": self._api.node_update},
            )
        return self._api

    async def node_update_path(self) -> str:
        """``rest`` or ``scontrol``: which path DOWN/DRAIN/RESUME take on this server."""
        return "rest" if (await self.api()).node_update else "scontrol"

    async def node(self, name: str) -> SlurmNodeState:
        api = await self.api()
        _, body = await self._request(
            "GET", api.path("node/{node_name}", node_name=checked_node(name)), op="get_node"
        )
        nodes = [n for n in body.get("nodes") or () if isinstance(n, Mapping)]
        if not nodes:
            raise PermanentError(f"Slurm node {name!r} not found", reason=Reason.UNKNOWN_NODE)
        with _shape("get_node"):
            node = node_from_json(nodes[0])
        if api.version == "v0.0.38" and node.reason and not (node.taken_out or "FAIL" in node.states):
            # 22.05 (v0.0.38) shows a DOWN node whose CPUs are still allocated (its jobs being
            # killed) as "mixed"/"allocated" without a DOWN flag; a reason says it is out of
            # service. scontrol shows the base state: ask it rather than report the node in service.
            return await self._fallback.node(name)
        return node

    async def nodes(self) -> list[SlurmNodeState]:
        # One list of every node; unlike ``node`` no scontrol fallback per node (that would be a
        # read per node): a 22.05 DOWN node still shown "mixed" (or "allocated") counts by its
        # reason instead (``_down_unshown``). From 23.02 on (v0.0.39+) the DOWN flag is shown at once.
        # 22.05's ``/nodes`` leaves out powered-down CLOUD nodes as every list does (v0.0.38
        # ``nodes.c`` asks ``slurm_load_node``): those the scontrol backend finds (``unlisted_nodes``).
        api = await self.api()
        _, body = await self._request("GET", api.path("nodes"), op="get_nodes")
        with _shape("get_nodes"):
            listed = nodes_from_payload(body)
        if api.version != "v0.0.38":
            return listed
        shown = [replace(n, states=n.states | {"DOWN"}) if _down_unshown(n) else n for n in listed]
        return shown + await self._fallback.unlisted_nodes({n.name for n in listed})

    async def jobs_on_node(self, name: str) -> list[JobSnapshot]:
        checked_node(name)
        return jobs_running_on(await self._jobs(), name)

    async def _jobs(self) -> list[JobSnapshot]:
        """Every job slurmctld knows."""
        api = await self.api()
        _, body = await self._request("GET", api.path("jobs"), op="get_jobs")
        with _shape("get_jobs"):
            return jobs_from_payload(body)

    async def job(self, job_id: str) -> JobSnapshot | None:
        api = await self.api()
        try:
            _, body = await self._request(
                "GET", api.path("job/{job_id}", job_id=checked_job(job_id)), op="get_job"
            )
        except PermanentError as exc:
            if exc.reason == Reason.UNKNOWN_JOB:
                return None
            raise
        except UnreadableAnswer:
            # 26.05.5 answers a job it forgot with a 404 no client reads (``UnreadableAnswer``):
            # the jobs it lists say whether it knows the job.
            return next((j for j in await self._jobs() if j.job_id == job_id), None)
        jobs = [j for j in body.get("jobs") or () if isinstance(j, Mapping)]
        with _shape("get_job"):
            return job_from_json(jobs[0]) if jobs else None

    async def partition_nodes(self, name: str) -> PartitionNodes | None:
        # Membership from the partitions' node lists: on 22.05 a node's own ``partitions`` missed
        # a partition created at run time (observed; scontrol listed it).
        node = checked_node(name)
        api = await self.api()
        _, body = await self._request("GET", api.path("partitions"), op="get_partitions")
        with _shape("get_partitions"):
            return member_partitions(partitions_from_payload(body), node)

    async def reservation(self, name: str) -> tuple[str, ...] | None:
        return await self._fallback.reservation(name)

    async def set_reservation_nodes(self, name: str, nodes: Sequence[str]) -> None:
        # slurmrestd 0.0.38 cannot change a reservation: scontrol does.
        await self._fallback.set_reservation_nodes(name, nodes)

    async def requeue(self, job_id: str) -> None:
        """Over REST where the server offers it (v0.0.45, Slurm 26.05 on: a ``GET`` that requeues,
        fenced as a change), else through ``scontrol``. A job already waiting requeued (422, "Job
        is pending execution") is done, as ``scontrol requeue`` takes it."""
        api = await self.api()
        if not api.job_requeue:
            await self._fallback.requeue(job_id)
            return
        path = api.path("job/{job_id}/requeue", job_id=checked_job(job_id))
        try:
            status, body = await self._request("GET", path, op="requeue", changes=True, allow={422})
        except UnreadableAnswer:
            # 26.05.5's answer to a job waiting requeued already (422) or unknown (404) is lost: the
            # job read back says which, as its answer would have.
            job = await self.job(job_id)
            if job is None:
                raise PermanentError("requeue: unknown Slurm job", reason=Reason.UNKNOWN_JOB) from None
            if job.not_requeueable:  # what 26.05 answers for it (HTTP 422, 2037 or 2039)
                raise not_requeueable(job_id, job.not_requeueable, "its answer was unreadable") from None
            if not job.pending:
                raise
            log.info("slurm job requeued", extra={"job_id": job_id, "backend": "rest", "already": True})
            return
        errors = errors_of(body)
        refused = next(((e, meaning) for e in errors if (meaning := e.requeue_refused)), None)
        if status == 422 and refused is not None:
            error, meaning = refused
            raise not_requeueable(job_id, meaning, f"{error.message}, error {error.errno}")
        if status == 422 and not (errors and all(e.job_pending for e in errors)):
            detail = "; ".join(e.message for e in errors[:3]) or "HTTP 422"
            raise PermanentError(f"requeue: HTTP 422: {detail}", reason=Reason.INVALID_REQUEST)
        log.info("slurm job requeued", extra={"job_id": job_id, "backend": "rest", "already": status == 422})

    async def signal_job(self, job_id: str, signal: str) -> None:
        await self._fallback.signal_job(job_id, signal)

    async def probe(self) -> Probe:
        """The API version, then the partitions, over slurmrestd with our token; where node updates
        go through ``scontrol`` on this server, that path is probed too. Changes nothing."""
        try:
            api = await self.api()
            _, body = await self._request("GET", api.path("partitions"), op="get_partitions")
            with _shape("get_partitions"):
                names = [p.name for p in partitions_from_payload(body)]
        except PitcrewError as exc:
            return Probe(
                "slurm", False, f"slurmrestd {self._url}: {exc}", missing=(probe_missing(exc, "slurmrestd"),)
            )
        detail = f"slurmrestd {self._url} {api.version}: partitions: {', '.join(names) or 'none'}"
        fallback = await self._fallback.probe()
        if not api.node_update:
            return replace(fallback, detail=f"{detail}; node updates need scontrol: {fallback.detail}")
        if api.job_requeue:
            return Probe("slurm", True, f"{detail}; node updates and requeue over REST")
        if fallback.ok:
            return Probe("slurm", True, f"{detail}; node updates over REST; requeue through scontrol")
        # No slurmrestd version before v0.0.45 (Slurm 26.05) has a requeue operation: without scontrol
        # (the REST-only image) a job still running on a DRAINed node cannot be requeued.
        why = (
            f"slurmrestd {api.version} has no requeue operation and scontrol is unusable here "
            f"({fallback.detail})"
        )
        return Probe(
            "slurm", True, f"{detail}; node updates over REST; no requeue", unable=(("requeue", why),)
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _update_node(self, name: str, state: str, reason: str | None) -> None:
        api = await self.api()
        if not api.node_update:
            if state == "RESUME":
                await self._fallback.resume(name)
            elif state == "DOWN":
                await self._fallback.down(name, reason or "")
            else:
                await self._fallback.drain(name, reason or "")
            return
        body: dict[str, Any] = {"state": [state]}
        if reason is not None:
            body["reason"] = clean_reason(reason) or "pitcrew"
        try:
            await self._request(
                "POST",
                api.path("node/{node_name}", node_name=checked_node(name)),
                op=f"node_{state.lower()}",
                json_body=body,
            )
        except UnreadableAnswer:
            # An error answer lost (26.05.5): read the node back; what was asked holds, or not.
            if not _holds(await self.node(name), state, body.get("reason")):
                raise
        log.info("slurm node updated", extra={"slurm_node": name, "state": state, "backend": "rest"})

    async def _request(
        self,
        method: str,
        path: str,
        *,
        op: str,
        json_body: Mapping[str, Any] | None = None,
        allow: frozenset[int] | set[int] = frozenset(),
        changes: bool = False,
    ) -> tuple[int, Mapping[str, Any]]:
        """``changes``: the request changes Slurm whatever its method (fenced: ``fenced.CHANGES``)."""
        try:
            status, body = await self._send(method, path, op, json_body, changes)
        except UnreadableAnswer:
            # 26.05.5 loses a refused token's answer too, so a token rotated meanwhile is tried at
            # once, as after a refusal read. The answer lost was an error: nothing was done.
            if not self._token.changed():
                raise
            status, body = await self._send(method, path, op, json_body, changes)
        errors = errors_of(body)
        if _refused(status, errors) and self._token.changed():
            status, body = await self._send(method, path, op, json_body, changes)  # the token was rotated
            errors = errors_of(body)
        if status in allow:
            return status, body
        if any(e.unknown_node for e in errors):
            raise PermanentError(f"{op}: unknown Slurm node", reason=Reason.UNKNOWN_NODE)
        if any(e.unknown_job for e in errors):
            raise PermanentError(f"{op}: unknown Slurm job", reason=Reason.UNKNOWN_JOB)
        detail = "; ".join(e.message for e in errors[:3]) or f"HTTP {status}"
        if _refused(status, errors):
            raise PermanentError(
                f"{op}: slurmrestd refused the token (HTTP {status}: {detail})", reason=Reason.UNAUTHORIZED
            )
        if any(e.invalid_node_state for e in errors):
            # Answered 500 (the code is not in slurmrestd's status map): the node's state refused the
            # change, which no retry alters. ``resume`` reads the node and takes "in service" as done.
            raise PermanentError(f"{op}: HTTP {status}: {detail}", reason=Reason.REFUSED)
        if any(e.controller_standby for e in errors):
            raise TransientError(
                f"{op}: slurmctld in standby (HTTP {status}: {detail})", reason=Reason.UNAVAILABLE
            )
        if status >= 500 or status == 429:
            # 22.05 answers 500 "Unspecified error" when slurmctld is down (and for a bad token).
            reason = Reason.RATE_LIMITED if status == 429 else Reason.UNAVAILABLE
            raise TransientError(f"{op}: HTTP {status}: {detail}", reason=reason)
        if status >= 400:
            refused = {404: Reason.NOT_FOUND, 405: Reason.UNSUPPORTED}.get(status, Reason.INVALID_REQUEST)
            raise PermanentError(f"{op}: HTTP {status}: {detail}", reason=refused)
        if errors:
            # 22.05 reports a lost controller this way too ("Unspecified error", errno -1).
            raise TransientError(f"{op}: {detail}", reason=Reason.UNAVAILABLE)
        if not body:
            raise PermanentError(f"{op}: HTTP {status} without a JSON body", reason=Reason.BAD_RESPONSE)
        return status, body

    async def _send(
        self, method: str, path: str, op: str, json_body: Mapping[str, Any] | None, changes: bool = False
    ) -> tuple[int, Mapping[str, Any]]:
        headers = {"X-SLURM-USER-NAME": self._user, "X-SLURM-USER-TOKEN": self._token.get()}
        try:
            async with self._client().request(
                method,
                self._url + path,
                headers=headers,
                json=json_body,
                trace_request_ctx=CHANGES if changes else None,
            ) as resp:
                text = await resp.text()
                status = resp.status
        except TimeoutError as exc:
            raise TransientError(f"{op}: slurmrestd gave no answer in time", reason=Reason.TIMEOUT) from exc
        except aiohttp.ClientResponseError:  # an answer came, not one HTTP can read
            raise UnreadableAnswer(
                f"{op}: slurmrestd's answer could not be read as HTTP (as 26.05.5 answers every error)",
                reason=Reason.BAD_RESPONSE,
            ) from None  # aiohttp's message quotes the bytes it could not read: a payload
        except aiohttp.ClientError as exc:
            raise TransientError(
                f"{op}: slurmrestd unreachable ({type(exc).__name__})", reason=Reason.UNREACHABLE
            ) from exc
        try:
            parsed = json.loads(text) if text.strip().startswith(("{", "[")) else {}
        except ValueError:
            parsed = {}
        return status, parsed if isinstance(parsed, Mapping) else {}

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=self._timeout, raise_for_status=False, trace_configs=traces(self._fence)
            )
        return self._session
