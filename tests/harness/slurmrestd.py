"""A wire-level slurmrestd stand-in (aiohttp): the real v0.0.38 OpenAPI document or a v0.0.40
one, node ``gpu-001`` and job ``1`` from the captured answers, JWT checks, injected 500s and
token rotation. For what the real 22.05 server on this machine cannot show.

On v0.0.40+ it answers as 23.11-24.11's source does (``src/slurmrestd``, ``node_mgr.c``):
* a token slurmctld refuses: the authentication error (1007) in ``errors``, HTTP 500 on 23.11 and
  511 from 24.05.5 (``refusal_status``); 401 only for a request without the header;
* an unknown node: a query that found nothing, "Failure to query node <name>" with errno 0;
* a RESUME of a node in service: ``ESLURM_INVALID_NODE_STATE`` (2028), HTTP 500.

On v0.0.45 it answers every error as the real 26.05.5 does on the wire (``wire/*.http``, captured
from the proving ground's 26.05 slurmrestd): the JSON answer with ``Connection: Close``, then on
the same connection a second answer, ``text/plain``, with the first error's text and the same
status, in one write (``framed_2605``); a RESUME of a node in service is 422 with 2180, "Invalid
node state transition"; an unknown node to update 422 with 2018; an unknown job 404 with 2017; a
token slurmctld refuses 511 with no error in the JSON, "Protocol authentication error" in the second;
a requeue of a job slurmctld will not requeue (``job``: ``--no-requeue``, ``srun``) 422 with 2037 or
2039, the job running on (``job_mgr.c`` ``_job_requeue_op``; the captured answers).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from aiohttp import web

from tests.conftest import FIXTURES

REST = FIXTURES / "slurm" / "rest"
V38_DOC = json.loads((REST / "openapi-v3.json").read_text())
V40_DOC: dict[str, Any] = {
    "paths": {
        "/slurm/v0.0.40/nodes/": {"get": {}, "post": {}},
        "/slurm/v0.0.40/node/{node_name}": {"get": {}, "post": {}, "delete": {}},
        "/slurm/v0.0.40/jobs/": {"get": {}},
        "/slurm/v0.0.40/job/{job_id}": {"get": {}, "post": {}, "delete": {}},
    }
}
#: 26.05's v0.0.45 paths pitcrew uses, with its job requeue (a ``GET``).
V45_DOC: dict[str, Any] = {
    "paths": {
        **{path.replace("v0.0.40", "v0.0.45"): ops for path, ops in V40_DOC["paths"].items()},
        "/slurm/v0.0.45/job/{job_id}/requeue": {"get": {}},
        "/slurm/v0.0.45/partitions/": {"get": {}},
    }
}
#: 26.05's answers to a requeue (``tests/fixtures/slurm/26.05/rest/v0.0.45``), by what the job was.
V45 = FIXTURES / "slurm" / "26.05" / "rest" / "v0.0.45"
REQUEUE_ANSWERS = {
    tag: json.loads((V45 / f"job-requeue-{tag}-response.json").read_text())
    for tag in ("running", "again", "unknown", "no-requeue", "srun")
}
SECRET = "eyJhbGciOiJIUzI1NiJ9.secret-part.signature"
#: 26.05.5's raw answers to what fails (``wire/<case>.http``): see ``framed_2605``.
WIRE = V45 / "wire"
#: The status lines 26.05.5's slurmrestd writes, as captured (500: a node update it could not parse).
STATUS_LINES = {
    404: "NOT FOUND",
    422: "UNPROCESSABLE CONTENT",
    500: "INTERNAL ERROR",
    511: "Network Authentication Required",
}


def framed_2605(status: int, body: bytes, text: str) -> bytes:
    """An error answer as 26.05.5's slurmrestd writes it: ``body`` (its JSON) with ``Connection:
    Close``, followed by a second answer with the same status, ``text/plain``, saying ``text``."""

    def answer(content: bytes, kind: str) -> bytes:
        head = f"HTTP/1.1 {status} {STATUS_LINES[status]}\r\nConnection: Close\r\n"
        return f"{head}Content-Length: {len(content)}\r\nContent-Type: {kind}\r\n\r\n".encode() + content

    return answer(body, "application/json") + answer(text.encode(), "text/plain")


class Unframed(NamedTuple):
    """A captured 26.05.5 error answer, taken apart: each answer's status line and headers, the
    first's JSON and the second's text."""

    head: list[bytes]
    body: bytes
    second_head: list[bytes]
    text: bytes

    @property
    def status(self) -> int:
        return int(self.head[0].split()[1])


def unframe_2605(raw: bytes) -> Unframed:
    """``raw`` (``wire/<case>.http``) as the answer its ``Content-Length`` bounds and what follows."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    length = int(next(line for line in lines if line.startswith(b"Content-Length")).split()[1])
    second_head, _, text = rest[length:].partition(b"\r\n\r\n")
    return Unframed(lines, rest[:length], second_head.split(b"\r\n"), text)


@dataclass
class FakeSlurmrestd:
    document: dict[str, Any]
    token: str = SECRET
    posts: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    node_state: list[str] = field(default_factory=lambda: ["IDLE"])
    node_reason: str = ""
    fail_with_500: bool = False
    #: slurmctld in standby (a backup before it takes control): every request answered with its
    #: error 2027 and this HTTP status, 500 on 24.11 (slurmrestd's operations.c maps no slurmctld
    #: error) and 422 on 26.05 (src/common/http.c: every slurmctld error 2000-2185 is a 422).
    standby_status: int | None = None
    #: Node updates answered 500, "Unspecified error", what is read still answered (slurmctld
    #: refusing a change pitcrew has no name for).
    fail_updates: bool = False
    #: How a refused token is answered on v0.0.40+: 500 (23.11) or 511 (24.05.5 and later).
    refusal_status: int = 500
    rotate_to: tuple[Path, str] | None = None  # rewrite the token file during the next request
    connections: list[Any] = field(default_factory=list)  # the client address of each request
    #: Jobs requeued (v0.0.45): job 1 runs until its first requeue, then waits requeued.
    requeues: list[str] = field(default_factory=list)
    #: Job 1 as captured (v0.0.45): ``running`` (the checkpointing job, ``--requeue``), or a job
    #: slurmctld will not requeue, ``no-requeue`` (sbatch ``--no-requeue``) or ``srun`` (no batch
    #: job): its requeue refused (422 with 2037 or 2039), the job running on.
    job: str = "running"

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/openapi/v3", self.openapi)
        app.router.add_get("/slurm/{version}/job/{job_id}/requeue", self.requeue)
        app.router.add_get("/slurm/{version}/partitions/", self.partitions)
        app.router.add_route("*", "/slurm/{version}/{kind}/{name}", self.object)
        # Only the spelling the document lists: v0.0.38 "/jobs", v0.0.40 "/jobs/".
        jobs = next(p for p in self.document["paths"] if p.rstrip("/").endswith("/jobs"))
        app.router.add_get(jobs.replace(jobs.split("/")[2], "{version}"), self.jobs)
        return app

    async def openapi(self, request: web.Request) -> web.Response:
        return web.json_response(self.document)

    def error(
        self, request: web.Request, payload: dict[str, Any], status: int, text: str | None = None
    ) -> web.Response:
        """An error answer: JSON, or on v0.0.45 as 26.05.5 frames it (``framed_2605``, saying
        ``text`` or else the first error's), written whole on the connection, which is then closed
        (what aiohttp would answer is dropped)."""
        if not self._v45(request):
            return web.json_response(payload, status=status)
        if text is None:
            text = next((e.get("error", "") for e in payload.get("errors", ())), "")
        assert request.transport is not None
        request.transport.write(framed_2605(status, json.dumps(payload, indent=2).encode(), text))
        request.transport.close()
        return web.Response(status=status)

    def refused(self, request: web.Request) -> web.Response | None:
        """Every request but the OpenAPI document passes here: counted, then refused or not."""
        self.connections.append(request.transport and request.transport.get_extra_info("peername"))
        if self.rotate_to is not None:
            path, new = self.rotate_to
            path.write_text(f"SLURM_JWT={new}\n")
            self.token, self.rotate_to = new, None
        given = request.headers.get("X-SLURM-USER-TOKEN")
        if given != self.token:
            if not given or self._v38(request):
                return web.Response(status=401, text="Authentication failure")
            if self._v45(request):  # 26.05.5: 511, no error in the JSON, the text in the second
                return self.error(request, {"errors": []}, 511, "Protocol authentication error")
            refused = {"error_number": 1007, "error": "Protocol authentication error"}
            return web.json_response({"errors": [refused]}, status=self.refusal_status)
        if self.fail_with_500:
            return self.error(request, {"errors": [{"error": "Unspecified error", "errno": -1}]}, 500)
        if self.standby_status is not None:
            standby = {"error_number": 2027, "error": "Slurm backup controller in standby mode"}
            return self.error(request, {"errors": [standby]}, self.standby_status)
        return None

    async def object(self, request: web.Request) -> web.Response:
        if (refused := self.refused(request)) is not None:
            return refused
        kind, name = request.match_info["kind"], request.match_info["name"]
        if request.method == "POST":
            if "post" not in self.document["paths"].get(
                f"/slurm/{request.match_info['version']}/node/{{node_name}}", {}
            ):
                return web.Response(status=405, text=(REST / "node-post-v0038-response.txt").read_text())
            body = await request.json()
            self.posts.append((request.path, body))
            if self.fail_updates:
                return self.error(
                    request, {"errors": [{"error": "Unspecified error", "error_number": -1}]}, 500
                )
            if request.match_info["name"] != "gpu-001" and self._v45(request):
                unknown = {"error_number": 2018, "error": "Invalid node name specified"}
                return self.error(request, {"errors": [unknown]}, 422)
            if body["state"] == ["RESUME"] and not {"DOWN", "DRAIN", "FAIL"} & set(self.node_state):
                if self._v45(request):
                    invalid = {"error_number": 2180, "error": "Invalid node state transition"}
                    return self.error(request, {"errors": [invalid]}, 422)
                invalid = {"error_number": 2028, "error": "Invalid node state specified"}
                return web.json_response({"errors": [invalid]}, status=500)
            # As slurmctld's update_node: RESUME clears DOWN and DRAIN; DRAIN is a flag on the base
            # state (a DOWN node becomes DOWN+DRAIN); DOWN sets the base and keeps the flag.
            drain = ["DRAIN"] if "DRAIN" in self.node_state else []
            if body["state"] == ["RESUME"]:
                self.node_state = ["IDLE"]
            elif body["state"] == ["DRAIN"]:
                self.node_state = [*(s for s in self.node_state if s != "DRAIN"), "DRAIN"]
            else:
                self.node_state = [*body["state"], *drain]
            self.node_reason = "" if body["state"] == ["RESUME"] else body.get("reason", "")
            return web.json_response({"errors": [], "warnings": []})
        if kind == "node" and name == "gpu-001":
            node = {
                "name": name,
                "state": self.node_state,
                "reason": self.node_reason,
                "reason_changed_at": {"set": False},
            }
            return web.json_response({"nodes": [node], "errors": []})
        if kind == "job" and name == "1":
            if self._v45(request) and self.job != "running":
                return web.json_response(json.loads((V45 / f"job-{self.job}.json").read_text()))
            if self._v45(request) and "1" in self.requeues:  # waiting requeued, as 26.05 shows it
                return web.json_response(json.loads((V45 / "job-requeued-by-rest.json").read_text()))
            return web.json_response(json.loads((REST / "job-running.json").read_text()))
        if kind == "node" and not self._v38(request):  # a query that found nothing, errno as it was
            found = {"error_number": 0, "description": f"Failure to query node {name}"}
            return web.json_response({"nodes": [], "errors": [found]})
        if kind == "job" and self._v45(request):
            unknown = {"description": f"Unable to query JobId={name}", "error_number": 2017}
            return self.error(request, {"errors": [{**unknown, "error": "Invalid job id specified"}]}, 404)
        error = {"node": "Invalid node name specified", "job": "Invalid job id specified"}[kind]
        return web.json_response(
            {"errors": [{"error": error, "error_number": 2018 if kind == "node" else 2017}]}, status=500
        )

    @staticmethod
    def _version(request: web.Request) -> str:
        return request.match_info.get("version", request.path.split("/")[2])

    def _v38(self, request: web.Request) -> bool:
        return self._version(request) == "v0.0.38"

    def _v45(self, request: web.Request) -> bool:
        return self._version(request) == "v0.0.45"

    async def requeue(self, request: web.Request) -> web.Response:
        """As 26.05 answers: 200 for a running job, 422 (2024) once it waits requeued, 404 (2017) for
        a job Slurm does not know, 422 (2037, 2039) for one it will not requeue, left running
        (``job``); what reached it is counted in ``requeues``."""
        if (refused := self.refused(request)) is not None:
            return refused
        job = request.match_info["job_id"]
        self.requeues.append(job)
        tag = "unknown" if job != "1" else ("again" if self.requeues.count(job) > 1 else "running")
        if job == "1" and self.job != "running":
            tag = self.job
        answer = dict(REQUEUE_ANSWERS[tag])
        status = answer.pop("http_status")
        return web.json_response(answer) if status == 200 else self.error(request, answer, status)

    async def partitions(self, request: web.Request) -> web.Response:
        return self.refused(request) or web.json_response(json.loads((V45 / "partitions.json").read_text()))

    async def jobs(self, request: web.Request) -> web.Response:
        return self.refused(request) or web.json_response(
            json.loads((REST / "jobs-running.json").read_text())
        )
