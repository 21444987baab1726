"""The same remediation moments, as Slurm 22.05, 24.11 and 26.05 print them, parse to the same records.

``tests/fixtures/slurm/{cli,rest}`` are 22.05 (REST v0.0.38); ``tests/fixtures/slurm/24.11`` and
``26.05`` were captured from the real servers by ``python -m proving_ground.slurm_capture --slurm
24.11`` (or ``26.05``): REST v0.0.40 to v0.0.42 (24.11) and v0.0.42 to v0.0.45 (26.05),
``scontrol --json``, ``scontrol show -o``, ``squeue --json``.
Cases, one table row per file and interface:

* a node DOWN with a reason, a node DRAINED under a running job, healthy nodes: states, reason,
  who set it, ``SlurmdStartTime`` (22.05's ``state`` + ``state_flags`` and plain times, 24.11's
  state lists and ``{"set", "number"}`` times; the ``[user@time]`` suffix of the text lines);
* a requeued job pending with no nodes, then running elsewhere with one restart;
* 24.11 keeps the last reason on a resumed node: it reads in service, the reason is history
  (26.05 clears it again);
* OpenAPI discovery picks v0.0.38 on 22.05 (node updates refused there), v0.0.42 on 24.11 and
  v0.0.45 on 26.05;
* 24.11's REST errors (unknown job) and ``sinfo --json``'s new grouped shape, which pitcrew
  does not read (it reads nodes from ``scontrol`` or slurmrestd) and refuses as malformed;
* a running job Slurm will not requeue (``--no-requeue``, and an ``srun`` job), from every
  interface of each release, with ``scontrol requeue``'s refusal and 26.05's REST one;
* every 24.11 and 26.05 capture has a row here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bot.domain.jobs import JobSnapshot, SlurmNodeState
from bot.domain.ownership import is_pitcrew_reason
from bot.integrations.slurm.cli import parse_job_line, parse_node_line
from bot.integrations.slurm.json import (
    discover_api,
    errors_of,
    jobs_from_payload,
    nodes_from_payload,
    requeue_refusal,
)
from tests.conftest import FIXTURES
from tests.harness.slurmrestd import unframe_2605

SLURM = FIXTURES / "slurm"
V24 = SLURM / "24.11"
V26 = SLURM / "26.05"
REST_VERSIONS = ("v0.0.40", "v0.0.41", "v0.0.42")
REST_VERSIONS_26 = ("v0.0.42", "v0.0.43", "v0.0.44", "v0.0.45")
OURS = "pitcrew: pc-00001 XID 79 gpu3"


def _json(path: Path) -> Any:
    return json.loads(path.read_text())


def node_lines(path: Path) -> list[SlurmNodeState]:
    return [parse_node_line(ln) for ln in path.read_text().splitlines() if ln.startswith("NodeName=")]


def job_lines(path: Path) -> list[JobSnapshot]:
    return [parse_job_line(ln) for ln in path.read_text().splitlines() if ln.startswith("JobId=")]


def node_json(path: Path) -> list[SlurmNodeState]:
    return nodes_from_payload(_json(path))


def job_json(path: Path) -> list[JobSnapshot]:
    return jobs_from_payload(_json(path))


NodeView = dict[str, tuple[frozenset[str], str, bool]]  # name -> (states, reason, in service)


def _nodes(**nodes: tuple[set[str], str, bool]) -> NodeView:
    return {name.replace("_", "-"): (frozenset(s), r, up) for name, (s, r, up) in nodes.items()}


HEALTHY_24 = _nodes(
    gpu_001=({"MIXED"}, "", True), gpu_002=({"MIXED"}, "", True), gpu_003=({"IDLE"}, "", True)
)
DOWN_DRAIN_24 = _nodes(
    gpu_001=({"DOWN"}, OURS, False),
    gpu_002=({"MIXED", "DRAIN"}, "XID 48 test", False),
    gpu_003=({"IDLE"}, "", True),
)
MOVED_24 = {**DOWN_DRAIN_24, "gpu-003": (frozenset({"MIXED"}), "", True)}

NodeRow = tuple[str, str, Callable[[Path], list[SlurmNodeState]], NodeView]


def _captured_nodes(release: str, versions: tuple[str, ...], resumed: NodeView) -> list[NodeRow]:
    """A captured release's node rows (``slurm_capture``): every moment from the text and JSON
    interfaces and each REST version; ``resumed``: how its resumed node reads."""
    one = {"gpu-001": HEALTHY_24["gpu-001"]}
    rows: list[NodeRow] = [
        (release, f"{release}/cli/scontrol-show-node-o-healthy.txt", node_lines, HEALTHY_24),
        (release, f"{release}/cli/scontrol-show-node-o-down-drain.txt", node_lines, DOWN_DRAIN_24),
        (release, f"{release}/cli/scontrol-show-node-o-requeued-running.txt", node_lines, MOVED_24),
        (release, f"{release}/cli/scontrol-show-node-o-resumed.txt", node_lines, resumed),
        (release, f"{release}/cli/scontrol-json-show-node-healthy.json", node_json, HEALTHY_24),
        (release, f"{release}/cli/scontrol-json-show-node-down-drain.json", node_json, DOWN_DRAIN_24),
        (release, f"{release}/cli/scontrol-json-show-node-requeued-running.json", node_json, MOVED_24),
    ]
    for v in versions:
        rest = f"{release}/rest/{v}"
        rows += [
            (release, f"{rest}/nodes-healthy.json", node_json, HEALTHY_24),
            (release, f"{rest}/nodes-down-drain.json", node_json, DOWN_DRAIN_24),
            (release, f"{rest}/nodes-requeued-running.json", node_json, MOVED_24),
            (release, f"{rest}/node-gpu-001-healthy.json", node_json, one),
            (
                release,
                f"{rest}/node-gpu-001-down-drain.json",
                node_json,
                {"gpu-001": DOWN_DRAIN_24["gpu-001"]},
            ),
            (
                release,
                f"{rest}/node-gpu-001-requeued-running.json",
                node_json,
                {"gpu-001": MOVED_24["gpu-001"]},
            ),
            (
                release,
                f"{rest}/node-gpu-002-down-drain.json",
                node_json,
                {"gpu-002": DOWN_DRAIN_24["gpu-002"]},
            ),
            (release, f"{rest}/node-gpu-001-resumed.json", node_json, resumed),
        ]
    return rows


#: (version, file under tests/fixtures/slurm, parser, nodes expected)
NODE_TABLE: list[tuple[str, str, Callable[[Path], list[SlurmNodeState]], NodeView]] = [
    ("22.05", "rest/nodes-all-healthy.json", node_json, _nodes(
        gpu_001=({"MIXED"}, "", True), gpu_002=({"IDLE"}, "", True), gpu_003=({"IDLE"}, "", True))),
    ("22.05", "rest/node-down.json", node_json, _nodes(gpu_001=({"DOWN"}, "XID 79", False))),
    ("22.05", "rest/node-drained.json", node_json, _nodes(gpu_001=({"DOWN", "DRAIN"}, "XID 79 drain test", False))),
    ("22.05", "cli/sinfo-down-drain.json", node_json, _nodes(
        gpu_001=({"DOWN"}, "XID 79", False), gpu_002=({"MIXED"}, "", True),
        gpu_003=({"MIXED", "DRAIN"}, "XID 48 test", False))),
    ("22.05", "cli/text-interfaces-during-remediation.txt", node_lines, _nodes(
        gpu_001=({"DOWN"}, "XID 79", False), gpu_003=({"MIXED", "DRAIN"}, "XID 48 test", False))),
    *_captured_nodes("24.11", REST_VERSIONS, _nodes(gpu_001=({"IDLE"}, OURS, True))),
    # 26.05 reads as 24.11 did, but for the reason of a resumed node: cleared again, as 22.05 did.
    *_captured_nodes("26.05", REST_VERSIONS_26, _nodes(gpu_001=({"IDLE"}, "", True))),
]  # fmt: skip

JobView = list[tuple[str, str, tuple[str, ...], int]]  # (id, state, nodes, restarts)
TRAIN_RUNNING: JobView = [("1", "RUNNING", ("gpu-001",), 0)]
TRAIN_PENDING: JobView = [("1", "PENDING", (), 1)]
TRAIN_MOVED: JobView = [("1", "RUNNING", ("gpu-003",), 1)]
OTHER: tuple[str, str, tuple[str, ...], int] = ("2", "RUNNING", ("gpu-002",), 0)

JobRow = tuple[str, str, Callable[[Path], list[JobSnapshot]], JobView]


def _captured_jobs(release: str, versions: tuple[str, ...]) -> list[JobRow]:
    """A captured release's job rows: every moment from each interface and REST version."""
    moments = (("healthy", TRAIN_RUNNING), ("down-drain", TRAIN_PENDING), ("requeued-running", TRAIN_MOVED))
    rows: list[JobRow] = []
    for moment, train in moments:
        rows += [
            (release, f"{release}/cli/scontrol-show-job-o-{moment}.txt", job_lines, train),
            (release, f"{release}/cli/scontrol-json-show-job-{moment}.json", job_json, train),
            (release, f"{release}/cli/squeue-json-{moment}.json", job_json, [*train, OTHER]),
            *[(release, f"{release}/rest/{v}/job-{moment}.json", job_json, train) for v in versions],
        ]
    return rows


JOB_TABLE: list[JobRow] = [
    ("22.05", "rest/job-running.json", job_json, TRAIN_RUNNING),
    ("22.05", "rest/job-requeued-pending.json", job_json, TRAIN_PENDING),
    ("22.05", "rest/job-running-after-requeue.json", job_json, [("1", "RUNNING", ("gpu-002",), 1)]),
    ("22.05", "cli/squeue-requeued.json", job_json, [
        ("1", "RUNNING", ("gpu-002",), 1), ("2", "RUNNING", ("gpu-003",), 0)]),
    *_captured_jobs("24.11", REST_VERSIONS),
    *_captured_jobs("26.05", REST_VERSIONS_26),
]  # fmt: skip


@pytest.mark.parametrize(("version", "name", "parse", "expected"), NODE_TABLE, ids=[r[1] for r in NODE_TABLE])
def test_nodes(
    version: str, name: str, parse: Callable[[Path], list[SlurmNodeState]], expected: NodeView
) -> None:
    nodes = {n.name: n for n in parse(SLURM / name)}
    assert {k: (n.states, n.reason, n.in_service) for k, n in nodes.items() if k in expected} == expected
    for node in nodes.values():
        if node.reason:
            assert node.reason_user == "root"
            assert is_pitcrew_reason(node.reason) == node.reason.startswith("pitcrew: ")
        if version != "22.05":  # every 24.11 and 26.05 interface says when slurmd started
            assert node.slurmd_started_at is not None
            assert node.gpus == 8


@pytest.mark.parametrize(("version", "name", "parse", "expected"), JOB_TABLE, ids=[r[1] for r in JOB_TABLE])
def test_jobs(version: str, name: str, parse: Callable[[Path], list[JobSnapshot]], expected: JobView) -> None:
    jobs = parse(SLURM / name)
    assert [(j.job_id, j.state, j.nodes, j.restarts) for j in jobs] == expected
    [train] = [j for j in jobs if j.job_id == "1"]  # the checkpointing job, --requeue, as root
    assert train.requeue and train.user == "root"
    assert train.gpus == 8 or not train.running


def test_openapi_discovery_on_26_05() -> None:
    """26.05 serves v0.0.42 to v0.0.45: the newest is taken, each pinned one updates nodes."""
    api = discover_api(_json(V26 / "rest" / "openapi-v3.json"))
    assert (api.version, api.node_update, api.versions) == ("v0.0.45", True, REST_VERSIONS_26)
    assert api.path("nodes") == "/slurm/v0.0.45/nodes/"
    for pinned in REST_VERSIONS_26:
        assert discover_api(_json(V26 / "rest" / "openapi-v3.json"), pinned).node_update


def test_openapi_discovery_on_each_version() -> None:
    old = discover_api(_json(SLURM / "rest" / "openapi-v3.json"))
    new = discover_api(_json(V24 / "rest" / "openapi-v3.json"))
    assert (old.version, old.node_update) == ("v0.0.38", False)
    assert (new.version, new.node_update, new.versions) == ("v0.0.42", True, REST_VERSIONS)
    assert new.path("nodes") == "/slurm/v0.0.42/nodes/"
    assert new.path("node/{node_name}", node_name="gpu-001") == "/slurm/v0.0.42/node/gpu-001"
    for pinned in REST_VERSIONS:
        assert discover_api(_json(V24 / "rest" / "openapi-v3.json"), pinned).node_update


def check_update_answer(path: Path) -> None:
    payload = _json(path)
    assert payload["status"] == 200
    assert errors_of(payload) == []
    assert payload["meta"]["slurm"]["release"] == {"24.11": "24.11.5", "26.05": "26.05.5"}[path.parts[-4]]


def check_unknown_job(path: Path) -> None:
    payload = _json(path)
    assert payload["status"] == 404
    [error] = errors_of(payload)
    assert error.unknown_job
    assert error.errno == 2017


def check_sinfo_grouped(path: Path) -> None:
    payload = _json(path)
    grouped = [tuple(entry["nodes"]["nodes"]) for entry in payload["sinfo"]]  # one entry per state
    assert {n for group in grouped for n in group} == {"gpu-001", "gpu-002", "gpu-003"}, grouped
    with pytest.raises(ValueError, match="no nodes list"):
        nodes_from_payload(payload)


def check_partitions(path: Path) -> None:
    from bot.integrations.slurm.json import member_partitions, partitions_from_payload

    assert member_partitions(partitions_from_payload(_json(path)), "gpu-002") is not None


def check_partition_lines(path: Path) -> None:
    from bot.integrations.slurm.cli import parse_partition_line

    [partition] = [
        parse_partition_line(ln) for ln in path.read_text().splitlines() if ln.startswith("Partition")
    ]
    assert (partition.name, partition.nodes, partition.total) == ("gpu", "gpu-[001-003]", 3)


def check_requeue_answer(path: Path) -> None:
    """26.05's answers to ``GET /slurm/v0.0.45/job/{id}/requeue``: the running job's 200, the
    waiting job's 422 ("Job is pending execution", done), the unknown job's 404."""
    payload = _json(path)
    errors = errors_of(payload)
    expected = {"running": (200, False, False), "again": (422, True, False), "unknown": (404, False, True)}
    tag = path.name.removeprefix("job-requeue-").removesuffix("-response.json")
    status, pending, unknown = expected[tag]
    assert payload["http_status"] == status
    assert (
        bool(errors) and all(e.job_pending for e in errors)
        if pending
        else not any(e.job_pending for e in errors)
    )
    assert any(e.unknown_job for e in errors) == unknown


def check_requeued_by_rest(path: Path) -> None:
    [job] = job_json(path)  # the job the REST requeue took off the DRAINed node
    assert (job.job_id, job.pending, job.restarts) == ("2", True, 1)


#: The two running jobs slurmctld will not requeue (``job_mgr.c`` ``_job_requeue_op``), captured on
#: each release: job 1 ``sbatch --no-requeue`` (ESLURM_DISABLED, 2037), job 2 ``srun`` (ESLURM_BATCH_ONLY,
#: 2039). Tag → (job id, requeue, batch, errno, what pitcrew says it means).
NOT_REQUEUEABLE = {
    "no-requeue": ("1", False, True, 2037, "--no-requeue"),
    "srun": ("2", True, False, 2039, "not a batch job"),
}


def check_not_requeueable(path: Path) -> None:
    """Each interface's record of a job Slurm will not requeue says why (``scontrol show job -o``'s
    ``Requeue=``/``BatchFlag=``, the JSON's ``requeue``/``batch_flag``); ``scontrol requeue``'s
    refusal (stderr) and 26.05's REST one (HTTP 422) are read as the refusals they are."""
    tag = next(t for t in NOT_REQUEUEABLE if f"-{t}." in path.name or f"-{t}-" in path.name)
    job_id, requeue, batch, errno, meaning = NOT_REQUEUEABLE[tag]
    if path.suffix == ".stderr":
        said = path.read_text().strip()
        assert said.endswith(f"for job {job_id}")
        assert meaning in (requeue_refusal(said) or ""), said
        return
    if path.name.startswith("job-requeue-"):
        payload = _json(path)
        [error] = errors_of(payload)
        assert (payload["http_status"], error.errno) == (422, errno)
        assert meaning in (error.requeue_refused or "") and not error.job_pending
        return
    [job] = job_lines(path) if path.suffix == ".txt" else job_json(path)
    assert (job.job_id, job.state, job.requeue, job.batch) == (job_id, "RUNNING", requeue, batch)
    assert meaning in (job.not_requeueable or "")


def _not_requeueable_captures(root: Path) -> dict[str, Callable[[Path], None]]:
    found = [p for p in root.rglob("*") if any(f"-{t}" in p.name for t in NOT_REQUEUEABLE)]
    return {str(p.relative_to(SLURM)): check_not_requeueable for p in sorted(found)}


#: What the first answer of each captured 26.05.5 error says, as ``SlurmError`` reads it.
WIRE_ERRORS: dict[str, tuple[int, str | None]] = {
    "node-post-unknown": (422, "unknown_node"),
    "node-resume-in-service": (422, "invalid_node_state"),
    "job-requeue-again": (422, "job_pending"),
    "job-requeue-unknown": (404, "unknown_job"),
    "job-get-unknown": (404, "unknown_job"),
    "token-refused": (511, None),  # no error in the JSON: the status says it
}


def check_wire_answer(path: Path) -> None:
    """26.05.5's raw answer to a request that failed: two answers with the same status, its JSON
    (``Connection: Close``) and a ``text/plain`` one with the error's text, which no HTTP client
    reads as one answer (``bot.integrations.slurm.rest.UnreadableAnswer``)."""
    answer = unframe_2605(path.read_bytes())
    status, meaning = WIRE_ERRORS[path.stem]
    assert answer.status == int(answer.second_head[0].split()[1]) == status
    assert b"Connection: Close" in answer.head and b"Content-Type: text/plain" in answer.second_head
    payload = json.loads(answer.body)
    if meaning is None:
        assert errors_of(payload) == [] and answer.text == b"Protocol authentication error"
        return
    [error] = errors_of(payload)
    assert getattr(error, meaning) and answer.text.decode() == payload["errors"][0]["error"]


OTHER_CHECKS: dict[str, Callable[[Path], None]] = {
    "24.11/rest/openapi-v3.json": lambda _: test_openapi_discovery_on_each_version(),
    "24.11/rest/v0.0.42/node-post-down-response.json": check_update_answer,
    "24.11/rest/v0.0.42/node-post-drain-response.json": check_update_answer,
    "24.11/rest/v0.0.42/node-post-resume-response.json": check_update_answer,
    "24.11/rest/v0.0.42/job-unknown.json": check_unknown_job,
    "24.11/rest/v0.0.42/partitions.json": check_partitions,
    "24.11/cli/sinfo-json-down-drain.json": check_sinfo_grouped,
    "24.11/cli/scontrol-show-partition-o.txt": check_partition_lines,
    "26.05/rest/openapi-v3.json": lambda _: test_openapi_discovery_on_26_05(),
    "26.05/rest/v0.0.45/node-post-down-response.json": check_update_answer,
    "26.05/rest/v0.0.45/node-post-drain-response.json": check_update_answer,
    "26.05/rest/v0.0.45/node-post-resume-response.json": check_update_answer,
    "26.05/rest/v0.0.45/job-unknown.json": check_unknown_job,
    "26.05/rest/v0.0.45/partitions.json": check_partitions,
    "26.05/cli/sinfo-json-healthy.json": check_sinfo_grouped,
    "26.05/cli/sinfo-json-down-drain.json": check_sinfo_grouped,
    "26.05/cli/sinfo-json-requeued-running.json": check_sinfo_grouped,
    "26.05/cli/scontrol-show-partition-o.txt": check_partition_lines,
    "26.05/rest/v0.0.45/job-requeue-running-response.json": check_requeue_answer,
    "26.05/rest/v0.0.45/job-requeue-again-response.json": check_requeue_answer,
    "26.05/rest/v0.0.45/job-requeue-unknown-response.json": check_requeue_answer,
    "26.05/rest/v0.0.45/job-requeued-by-rest.json": check_requeued_by_rest,
    **{f"26.05/rest/v0.0.45/wire/{name}.http": check_wire_answer for name in WIRE_ERRORS},
    **_not_requeueable_captures(V24),
    **_not_requeueable_captures(V26),
}


@pytest.mark.parametrize("name", sorted(OTHER_CHECKS))
def test_other_captures(name: str) -> None:
    OTHER_CHECKS[name](SLURM / name)


@pytest.mark.parametrize("root", [V24, V26], ids=["24.11", "26.05"])
def test_every_capture_has_a_row(root: Path) -> None:
    files = {str(p.relative_to(SLURM)) for p in root.rglob("*") if p.is_file() and p.name != "README.md"}
    covered = {r[1] for r in NODE_TABLE} | {r[1] for r in JOB_TABLE} | set(OTHER_CHECKS)
    assert files == {f for f in covered if f.startswith(f"{root.name}/")}
