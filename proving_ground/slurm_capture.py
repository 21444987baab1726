"""Capture what a real Slurm answers during a remediation, for the parsers' table tests.

``python -m proving_ground.slurm_capture --slurm 24.11 tests/fixtures/slurm/24.11`` starts a
cluster of that version (with slurmrestd), runs the moments pitcrew reads — every node healthy
with the checkpointing job running; gpu-001 DOWN (over REST) under that job, gpu-003 DRAINED
with another job still on it; the job requeued and running elsewhere; gpu-001 RESUMEd — and
writes, verbatim, Slurm's answers at each: ``cli/`` (``scontrol --json``, ``squeue --json``,
``sinfo --json``, ``scontrol show … -o``) and ``rest/<version>/`` for every API version the
server offers, plus its OpenAPI document. Only the run directory's path is replaced by
``$RUN`` so captures do not name a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from proving_ground.slurm import SlurmCluster
from proving_ground.slurm_root import VERSIONS


class Capture:
    def __init__(self, cluster: SlurmCluster, out: Path) -> None:
        self.cluster = cluster
        self.out = out
        self.token = cluster.token()

    def rest(self, path: str, method: str = "GET", body: dict[str, Any] | None = None) -> tuple[int, Any]:
        request = urllib.request.Request(
            self.cluster.rest_url + path,
            method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={
                "X-SLURM-USER-NAME": "root",
                "X-SLURM-USER-TOKEN": self.token,
                "Content-Type": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as refused:
            return refused.code, json.loads(refused.read() or b"{}")

    def save(self, name: str, content: str) -> None:
        path = self.out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content.replace(str(self.cluster.run_dir), "$RUN"))
        print(f"  {name}")

    def save_json(self, name: str, payload: Any) -> None:
        self.save(name, json.dumps(payload, indent=1) + "\n")

    def cli(self, name: str, *argv: str) -> None:
        self.save(f"cli/{name}", self.cluster.run(*argv).stdout)

    def moment(self, tag: str, versions: list[str], job_id: str, nodes: tuple[str, ...]) -> None:
        self.cli(f"scontrol-json-show-node-{tag}.json", "scontrol", "--json", "show", "node")
        self.cli(f"scontrol-json-show-job-{tag}.json", "scontrol", "--json", "show", "job", job_id)
        self.cli(f"scontrol-show-node-o-{tag}.txt", "scontrol", "show", "node", "-o")
        self.cli(f"scontrol-show-job-o-{tag}.txt", "scontrol", "show", "job", "-o", job_id)
        self.cli(f"squeue-json-{tag}.json", "squeue", "--json")
        self.cli(f"sinfo-json-{tag}.json", "sinfo", "--json")
        for version in versions:
            self.save_json(f"rest/{version}/nodes-{tag}.json", self.rest(f"/slurm/{version}/nodes/")[1])
            self.save_json(f"rest/{version}/job-{tag}.json", self.rest(f"/slurm/{version}/job/{job_id}")[1])
            for node in nodes:
                answer = self.rest(f"/slurm/{version}/node/{node}")[1]
                self.save_json(f"rest/{version}/node-{node}-{tag}.json", answer)


def capture(cluster: SlurmCluster, out: Path) -> None:
    cap = Capture(cluster, out)
    status, document = cap.rest("/openapi/v3")
    if status != 200:
        raise SystemExit(f"slurmrestd gave no OpenAPI document (HTTP {status})")
    cap.save("rest/openapi-v3.json", json.dumps(document, separators=(",", ":")) + "\n")
    versions = sorted({p.split("/")[2] for p in document["paths"] if p.startswith("/slurm/v")})
    newest = versions[-1]
    train = cluster.submit_training()
    other = cluster.submit("--job-name=other", "--gres=gpu:h100:8", "--wrap=sleep 300")
    cluster_wait(cluster, lambda: all((j := cluster.job(i)) and j.running for i in (train, other)))
    first = cluster.job(train)
    assert first is not None
    node = first.nodes[0]
    other_job = cluster.job(other)
    assert other_job is not None
    drained = other_job.nodes[0]
    cap.moment("healthy", versions, train, (node,))

    status, answer = cap.rest(
        f"/slurm/{newest}/node/{node}", "POST", {"state": ["DOWN"], "reason": "pitcrew: pc-00001 XID 79 gpu3"}
    )
    cap.save_json(f"rest/{newest}/node-post-down-response.json", {"status": status, **answer})
    status, answer = cap.rest(
        f"/slurm/{newest}/node/{drained}", "POST", {"state": ["DRAIN"], "reason": "XID 48 test"}
    )
    cap.save_json(f"rest/{newest}/node-post-drain-response.json", {"status": status, **answer})
    cluster_wait(cluster, lambda: (j := cluster.job(train)) is not None and j.restarts == 1)
    cap.moment("down-drain", versions, train, (node, drained))

    cluster_wait(cluster, lambda: (j := cluster.job(train)) is not None and j.running and node not in j.nodes)
    cap.moment("requeued-running", versions, train, (node,))

    status, answer = cap.rest(f"/slurm/{newest}/node/{node}", "POST", {"state": ["RESUME"]})
    cap.save_json(f"rest/{newest}/node-post-resume-response.json", {"status": status, **answer})
    cluster_wait(cluster, lambda: cluster.node(node).in_service)
    for version in versions:
        cap.save_json(
            f"rest/{version}/node-{node}-resumed.json", cap.rest(f"/slurm/{version}/node/{node}")[1]
        )
    cap.cli("scontrol-show-node-o-resumed.txt", "scontrol", "show", "node", "-o", node)
    cap.cli("scontrol-show-partition-o.txt", "scontrol", "show", "partition", "-o")
    cap.save_json(f"rest/{newest}/partitions.json", cap.rest(f"/slurm/{newest}/partitions/")[1])
    cap.save_json(
        f"rest/{newest}/job-unknown.json",
        {"status": (a := cap.rest(f"/slurm/{newest}/job/999999"))[0], **a[1]},
    )
    if f"/slurm/{newest}/job/{{job_id}}/requeue" in document["paths"]:  # 26.05's v0.0.45 on
        # The job still running on the DRAINed node, requeued as the drain step asks; asked again
        # while it waits requeued; and a job Slurm does not know.
        for tag, job in (("running", other), ("again", other), ("unknown", "999999")):
            status, answer = cap.rest(f"/slurm/{newest}/job/{job}/requeue")
            cap.save_json(f"rest/{newest}/job-requeue-{tag}-response.json", {"http_status": status, **answer})
            if tag == "running":
                cluster_wait(cluster, lambda: (j := cluster.job(other)) is not None and j.restarts == 1)
                cap.save_json(
                    f"rest/{newest}/job-requeued-by-rest.json", cap.rest(f"/slurm/{newest}/job/{other}")[1]
                )


def cluster_wait(cluster: SlurmCluster, predicate: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out; logs:\n{cluster.logs()}")
        time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--slurm", choices=VERSIONS, default=None)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    cluster = SlurmCluster(Path(tempfile.mkdtemp(prefix="pitcrew-capture-")), version=args.slurm)
    cluster.start()
    try:
        capture(cluster, args.out)
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
