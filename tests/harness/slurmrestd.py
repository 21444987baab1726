"""A wire-level slurmrestd stand-in (aiohttp): the real v0.0.38 OpenAPI document or a v0.0.40
one, node ``gpu-001`` and job ``1`` from the captured answers, JWT checks, injected 500s and
token rotation. For what the real 22.05 server on this machine cannot show.

On v0.0.40+ it answers as 23.11-24.11's source does (``src/slurmrestd``, ``node_mgr.c``):
* a token slurmctld refuses: the authentication error (1007) in ``errors``, HTTP 500 on 23.11 and
  511 from 24.05.5 (``refusal_status``); 401 only for a request without the header;
* an unknown node: a query that found nothing, "Failure to query node <name>" with errno 0;
* a RESUME of a node in service: ``ESLURM_INVALID_NODE_STATE`` (2028), HTTP 500.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    }
}
#: 26.05's answers to a requeue (``tests/fixtures/slurm/26.05/rest/v0.0.45``), by what the job was.
V45 = FIXTURES / "slurm" / "26.05" / "rest" / "v0.0.45"
REQUEUE_ANSWERS = {
    tag: json.loads((V45 / f"job-requeue-{tag}-response.json").read_text())
    for tag in ("running", "again", "unknown")
}
SECRET = "eyJhbGciOiJIUzI1NiJ9.secret-part.signature"


@dataclass
class FakeSlurmrestd:
    document: dict[str, Any]
    token: str = SECRET
    posts: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    node_state: list[str] = field(default_factory=lambda: ["IDLE"])
    fail_with_500: bool = False
    #: How a refused token is answered on v0.0.40+: 500 (23.11) or 511 (24.05.5 and later).
    refusal_status: int = 500
    rotate_to: tuple[Path, str] | None = None  # rewrite the token file during the next request
    connections: list[Any] = field(default_factory=list)  # the client address of each request
    #: Jobs requeued (v0.0.45): job 1 runs until its first requeue, then waits requeued.
    requeues: list[str] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/openapi/v3", self.openapi)
        app.router.add_get("/slurm/{version}/job/{job_id}/requeue", self.requeue)
        app.router.add_route("*", "/slurm/{version}/{kind}/{name}", self.object)
        # Only the spelling the document lists: v0.0.38 "/jobs", v0.0.40 "/jobs/".
        jobs = next(p for p in self.document["paths"] if p.rstrip("/").endswith("/jobs"))
        app.router.add_get(jobs.replace(jobs.split("/")[2], "{version}"), self.jobs)
        return app

    async def openapi(self, request: web.Request) -> web.Response:
        return web.json_response(self.document)

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
            refused = {"error_number": 1007, "error": "Protocol authentication error"}
            return web.json_response({"errors": [refused]}, status=self.refusal_status)
        if self.fail_with_500:
            return web.json_response({"errors": [{"error": "Unspecified error", "errno": -1}]}, status=500)
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
            if body["state"] == ["RESUME"] and not {"DOWN", "DRAIN", "FAIL"} & set(self.node_state):
                invalid = {"error_number": 2028, "error": "Invalid node state specified"}
                return web.json_response({"errors": [invalid]}, status=500)
            self.node_state = ["IDLE"] if body["state"] == ["RESUME"] else body["state"]
            return web.json_response({"errors": [], "warnings": []})
        if kind == "node" and name == "gpu-001":
            node = {"name": name, "state": self.node_state, "reason": "", "reason_changed_at": {"set": False}}
            return web.json_response({"nodes": [node], "errors": []})
        if kind == "job" and name == "1":
            return web.json_response(json.loads((REST / "job-running.json").read_text()))
        if kind == "node" and not self._v38(request):  # a query that found nothing, errno as it was
            found = {"error_number": 0, "description": f"Failure to query node {name}"}
            return web.json_response({"nodes": [], "errors": [found]})
        error = {"node": "Invalid node name specified", "job": "Invalid job id specified"}[kind]
        return web.json_response(
            {"errors": [{"error": error, "error_number": 2018 if kind == "node" else 2017}]}, status=500
        )

    @staticmethod
    def _v38(request: web.Request) -> bool:
        return request.match_info.get("version", request.path.split("/")[2]) == "v0.0.38"

    async def requeue(self, request: web.Request) -> web.Response:
        """As 26.05 answers: 200 for a running job, 422 (2024) once it waits requeued, 404 (2017) for
        a job Slurm does not know; what reached it is counted in ``requeues``."""
        if (refused := self.refused(request)) is not None:
            return refused
        job = request.match_info["job_id"]
        self.requeues.append(job)
        tag = "unknown" if job != "1" else ("again" if self.requeues.count(job) > 1 else "running")
        answer = dict(REQUEUE_ANSWERS[tag])
        return web.json_response(answer, status=answer.pop("http_status"))

    async def jobs(self, request: web.Request) -> web.Response:
        return self.refused(request) or web.json_response(
            json.loads((REST / "jobs-running.json").read_text())
        )
