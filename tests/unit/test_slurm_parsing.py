"""Parsing Slurm's real outputs (``tests/fixtures/slurm``) into pitcrew's records.

Cases:
* every captured file has a check below, and a new capture without one fails the suite;
* ``scontrol show node/job -o`` lines: reasons with spaces, ``=`` and brackets, the
  ``[user@time]`` suffix, empty values (``NodeList=``), compound states (``MIXED+DRAIN``);
* REST v0.0.38 and ``squeue``/``sinfo --json``: down/drain nodes, requeued/pending jobs
  with an empty node list, ``sacct``/slurmdb history records;
* the v0.0.39+ shapes (state lists, ``{"set", "number"}`` times) and OpenAPI discovery;
* partitions (``scontrol show partition -o`` and REST ``/partitions``, v0.0.38 and v0.0.40+
  shapes) into the breaker's fleet: the partitions a node is in, their distinct nodes (a
  node in two partitions counts once), ``Nodes=ALL``, a node in no partition;
* command failures become the right bounded error.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bot.domain.jobs import SlurmNodeState
from bot.domain.ownership import is_pitcrew_reason
from bot.engine.errors import PermanentError, Reason, TransientError
from bot.engine.ports import PartitionNodes
from bot.integrations.slurm.cli import (
    ScontrolScheduler,
    classify_failure,
    parse_job_line,
    parse_kv,
    parse_node_line,
    parse_partition_line,
    parse_sinfo_node_line,
)
from bot.integrations.slurm.json import (
    Partition,
    discover_api,
    errors_of,
    job_from_json,
    jobs_from_payload,
    jobs_running_on,
    member_partitions,
    node_from_json,
    nodes_from_payload,
    partition_from_json,
    partitions_from_payload,
)
from tests.conftest import FIXTURES
from tests.unit.test_slurm_versions import check_not_requeueable

SLURM = FIXTURES / "slurm"


def _json(path: Path) -> Any:
    return json.loads(path.read_text())


def _lines(path: Path, prefix: str) -> list[str]:
    return [ln for ln in path.read_text().splitlines() if ln.startswith(prefix)]


# -- one check per captured file ----------------------------------------------------------
def check_show_node(path: Path) -> None:
    nodes = {n.name: n for n in map(parse_node_line, _lines(path, "NodeName="))}
    assert nodes["gpu-001"].states == {"MIXED"}
    assert nodes["gpu-001"].reason == ""
    # SlurmdStartTime=2026-11-29T08:17:12, the controller's local time (UTC on the capture host).
    assert nodes["gpu-001"].slurmd_started_at == datetime(2026, 11, 29, 8, 17, 12).astimezone(UTC)
    drained = nodes["gpu-003"]
    assert drained.states == {"IDLE", "DRAIN"}
    assert drained.drained
    assert not drained.in_service
    assert drained.reason == "XID 79 test"
    assert drained.reason_user == "root"
    assert drained.reason_time is not None
    assert not is_pitcrew_reason(drained.reason)


def check_show_job(path: Path) -> None:
    jobs = {j.job_id: j for j in map(parse_job_line, _lines(path, "JobId="))}
    assert [j.state for j in jobs.values()] == ["CANCELLED", "CANCELLED", "RUNNING", "RUNNING", "COMPLETED"]
    assert jobs["2"].restarts == 1
    assert jobs["2"].nodes == ("gpu-002",)
    assert jobs["3"].running
    assert jobs["3"].requeue
    assert jobs["3"].user == "root"
    assert jobs["3"].name == "ckpt-train"
    assert jobs["3"].reason == ""


def check_remediation_text(path: Path) -> None:
    nodes = [parse_node_line(ln) for ln in _lines(path, "NodeName=")]
    assert [(n.name, set(n.states), n.reason) for n in nodes] == [
        ("gpu-001", {"DOWN"}, "XID 79"),
        ("gpu-003", {"MIXED", "DRAIN"}, "XID 48 test"),
    ]
    pending, running, jobcomp = (parse_job_line(ln) for ln in _lines(path, "JobId="))
    assert pending.pending
    assert pending.nodes == ()
    assert pending.restarts == 1
    assert running.running
    assert running.nodes == ("gpu-002",)
    assert running.restarts == 1
    # The jobcomp line has the same key=value form and keeps the run that died with the node.
    assert jobcomp.state == "NODE_FAIL"
    assert jobcomp.nodes == ("gpu-001",)
    assert jobcomp.ended_for_good


def check_scontrol_json_unsupported(path: Path) -> None:
    error = classify_failure("show_node", path.read_text())
    assert isinstance(error, PermanentError)
    assert error.reason == Reason.INVALID_REQUEST


def check_sacct_text(path: Path) -> None:
    # pitcrew reads no accounting (it needs slurmdbd); the text must agree with the JSON capture.
    rows = [ln.split() for ln in path.read_text().splitlines()[2:] if ln.split()[0] == "1"]
    history = jobs_from_payload(_json(SLURM / "cli" / "sacct-D-dbd.json"))
    assert [(r[2].rstrip("+"), r[3]) for r in rows] == [("NODE_FAIL", "gpu-001"), ("CANCELLED", "gpu-002")]
    assert [(j.state, j.nodes) for j in history] == [("NODE_FAIL", ("gpu-001",)), ("CANCELLED", ("gpu-002",))]


def check_slurmdb_json(path: Path) -> None:
    history = jobs_from_payload(_json(path))
    assert [j.job_id for j in history] == ["1", "1"]
    assert history[0].state == "NODE_FAIL"
    assert history[0].user == "root"
    assert history[0].start_time is not None


def check_sinfo(path: Path) -> None:
    nodes = {n.name: n for n in nodes_from_payload(_json(path))}
    assert nodes["gpu-003"].states == {"IDLE", "DRAIN"}
    assert nodes["gpu-003"].reason == "XID 79 test"
    assert nodes["gpu-001"].in_service
    assert nodes["gpu-001"].reason_user is None


def check_sinfo_down_drain(path: Path) -> None:
    nodes = {n.name: n for n in nodes_from_payload(_json(path))}
    assert nodes["gpu-001"].down
    assert nodes["gpu-001"].reason == "XID 79"
    assert nodes["gpu-001"].reason_time == datetime.fromtimestamp(1795940740, tz=UTC)
    assert nodes["gpu-001"].slurmd_started_at == datetime.fromtimestamp(1795940737, tz=UTC)
    assert nodes["gpu-003"].states == {"MIXED", "DRAIN"}
    assert nodes["gpu-003"].reason == "XID 48 test"


def check_squeue(path: Path) -> None:
    jobs = jobs_from_payload(_json(path))
    assert [j.state for j in jobs] == ["CANCELLED", "CANCELLED", "RUNNING", "RUNNING", "COMPLETED"]
    # squeue --json ignores -w in 22.05: the filter is ours.
    assert [j.job_id for j in jobs_running_on(jobs, "gpu-002")] == ["4"]
    assert [j.job_id for j in jobs_running_on(jobs, "gpu-001")] == ["3"]


def check_squeue_requeued(path: Path) -> None:
    jobs = {j.job_id: j for j in jobs_from_payload(_json(path))}
    assert jobs["1"].running
    assert jobs["1"].restarts == 1
    assert jobs["1"].nodes == ("gpu-002",)


def rest_job(state: str, nodes: tuple[str, ...], restarts: int) -> Callable[[Path], None]:
    def check(path: Path) -> None:
        (job,) = jobs_from_payload(_json(path))
        assert (job.state, job.nodes, job.restarts, job.requeue) == (state, nodes, restarts, True)
        assert job.reason == ""
        assert job.user == "root"
        assert job.start_time is not None

    return check


def rest_nodes(expected: dict[str, tuple[set[str], str]]) -> Callable[[Path], None]:
    def check(path: Path) -> None:
        got = {n.name: (set(n.states), n.reason) for n in nodes_from_payload(_json(path))}
        assert got == expected

    return check


def check_openapi(path: Path) -> None:
    api = discover_api(_json(path))
    assert (api.version, api.node_update) == ("v0.0.38", False)
    assert api.versions == ("v0.0.38",)  # 22.05 also serves v0.0.36/37, shapes pitcrew does not read
    assert api.path("node/{node_name}", node_name="gpu-001") == "/slurm/v0.0.38/node/gpu-001"


def check_show_partition(path: Path) -> None:
    partitions = [parse_partition_line(ln) for ln in _lines(path, "PartitionName=")]
    assert partitions == [Partition("gpu", "gpu-[001-004]", 4), Partition("debug", "gpu-[003-004]", 2)]
    assert member_partitions(partitions, "gpu-001") == PartitionNodes(4, ("gpu",))
    assert member_partitions(partitions, "gpu-004") == PartitionNodes(4, ("gpu", "debug"))
    assert member_partitions(partitions, "cpu-001") is None


def check_rest_partitions(path: Path) -> None:
    no_errors(path)
    assert partitions_from_payload(_json(path)) == [Partition("gpu", "gpu-[001-003]", 3)]
    assert member_partitions(partitions_from_payload(_json(path)), "gpu-002") == PartitionNodes(3, ("gpu",))


def check_post_node_refused(path: Path) -> None:
    text = path.read_text()
    assert "HTTP 405" in text
    assert "not defined" in text


def no_errors(path: Path) -> None:
    assert errors_of(_json(path)) == []


def check_ping(path: Path) -> None:
    no_errors(path)
    assert _json(path)["pings"][0]["ping"] == "UP"


def check_submit_body(path: Path) -> None:
    body = _json(path)  # a request body pitcrew never sends; the tests submit with sbatch
    assert body["job"]["requeue"] is True
    assert "--requeue" in body["script"]


CHECKS: dict[str, Callable[[Path], None]] = {
    "cli/sacct-D-dbd.json": check_slurmdb_json,
    "cli/sacct-D-dbd.txt": check_sacct_text,
    "cli/scontrol-json-show-node.txt": check_scontrol_json_unsupported,
    "cli/scontrol-show-job-o.txt": check_show_job,
    "cli/scontrol-show-node-o.txt": check_show_node,
    "cli/scontrol-show-partition-o.txt": check_show_partition,
    "cli/sinfo-down-drain.json": check_sinfo_down_drain,
    "cli/sinfo.json": check_sinfo,
    "cli/squeue-requeued.json": check_squeue_requeued,
    "cli/squeue.json": check_squeue,
    "cli/text-interfaces-during-remediation.txt": check_remediation_text,
    "rest/diag.json": no_errors,
    "rest/job-cancel-response.json": no_errors,
    "rest/job-requeued-pending.json": rest_job("PENDING", (), 1),
    "rest/job-running-after-requeue.json": rest_job("RUNNING", ("gpu-002",), 1),
    "rest/job-running.json": rest_job("RUNNING", ("gpu-001",), 0),
    "rest/job-submit-response.json": no_errors,
    "rest/job-update-response.json": no_errors,
    "rest/jobs-running.json": rest_job("RUNNING", ("gpu-001",), 0),
    "rest/node-down.json": rest_nodes({"gpu-001": ({"DOWN"}, "XID 79")}),
    "rest/node-drained.json": rest_nodes({"gpu-001": ({"DOWN", "DRAIN"}, "XID 79 drain test")}),
    "rest/node-post-v0038-response.txt": check_post_node_refused,
    "rest/nodes-all-healthy.json": rest_nodes(
        {f"gpu-00{i}": ({s}, "") for i, s in ((1, "MIXED"), (2, "IDLE"), (3, "IDLE"))}
    ),
    "rest/nodes-one-down.json": rest_nodes(
        {"gpu-001": ({"DOWN"}, "XID 79"), "gpu-002": ({"IDLE"}, ""), "gpu-003": ({"IDLE"}, "")}
    ),
    "rest/openapi-v3.json": check_openapi,
    "rest/partitions.json": check_rest_partitions,
    "rest/ping.json": check_ping,
    "rest/slurmdb-v0.0.38-job-1.json": check_slurmdb_json,
    "rest/submit.json": check_submit_body,
    # A running job Slurm will not requeue, as 22.05 shows it: table-tested with 24.11's and 26.05's.
    **{
        f"{where}-{tag}{ext}": check_not_requeueable
        for tag in ("no-requeue", "srun")
        for where, ext in (
            ("cli/scontrol-show-job-o", ".txt"),
            ("cli/scontrol-requeue", ".stderr"),
            ("rest/job", ".json"),
        )
    },
}


def test_every_captured_file_has_a_check() -> None:
    files = {str(p.relative_to(SLURM)) for p in SLURM.rglob("*") if p.is_file() and p.name != "README.md"}
    # Slurm 24.11's and 26.05's captures are table-tested beside these in test_slurm_versions.
    assert {f for f in files if not f.startswith(("24.11/", "26.05/"))} == set(CHECKS)


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_captured_output(name: str) -> None:
    CHECKS[name](SLURM / name)


# -- partitions beyond the captures --------------------------------------------------------
@pytest.mark.parametrize(
    ("partitions", "node", "expected"),
    [
        ([Partition("a", "n[1-4]", 4), Partition("b", "n[3-6]", 4)], "n3", PartitionNodes(6, ("a", "b"))),
        ([Partition("a", "n[1-4]", 4), Partition("b", "n[3-6]", 4)], "n5", PartitionNodes(4, ("b",))),
        ([Partition("all", "ALL", 9), Partition("b", "n[1-2]", 2)], "n1", PartitionNodes(9, ("all", "b"))),
        ([Partition("empty", "(null)", 0), Partition("b", "n[1-2]", 2)], "n1", PartitionNodes(2, ("b",))),
        ([Partition("b", "n[1-2]", 2)], "n3", None),
        ([], "n1", None),
    ],
    ids=["overlap-counts-once", "one-of-two", "nodes-all", "empty-partition", "in-none", "no-partitions"],
)
def test_member_partitions(partitions: list[Partition], node: str, expected: PartitionNodes | None) -> None:
    assert member_partitions(partitions, node) == expected


def test_partition_json_shapes() -> None:
    v40 = {"name": "gpu", "nodes": {"allowed_allocation": "", "configured": "gpu-[001-008]", "total": 8}}
    assert partition_from_json(v40) == Partition("gpu", "gpu-[001-008]", 8)
    v39 = {"name": "gpu", "nodes": "gpu-[001-002]", "total_nodes": {"set": True, "number": 2}}
    assert partition_from_json(v39) == Partition("gpu", "gpu-[001-002]", 2)
    with pytest.raises(ValueError):
        partitions_from_payload({"errors": []})


# -- scontrol -o lines beyond the captures ---------------------------------------------------
@pytest.mark.parametrize(
    ("tail", "reason", "user"),
    [
        ("Reason=XID 79 [root@2026-11-29T08:25:40]", "XID 79", "root"),
        (
            "Reason=pitcrew: inc-1 XID=79 gpu[3] a@b [root@2026-11-29T09:26:28]",
            "pitcrew: inc-1 XID=79 gpu[3] a@b",
            "root",
        ),
        ("Reason=Not responding [slurm@2026-11-29T09:00:00] Comment=x", "Not responding", "slurm"),
        ("Reason=no suffix at all", "no suffix at all", None),
        ("Reason=(null)", "", None),
        ("", "", None),
    ],
)
def test_node_reason(tail: str, reason: str, user: str | None) -> None:
    node = parse_node_line(
        f"NodeName=n1 Arch=x86_64 OS=Linux 6.1 #1 SMP @0  State=DOWN+DRAIN Weight=1 {tail}"
    )
    assert (node.reason, node.reason_user, set(node.states)) == (reason, user, {"DOWN", "DRAIN"})


@pytest.mark.parametrize(
    ("state", "states"),
    [
        ("IDLE", {"IDLE"}),
        ("MIXED+DRAIN", {"MIXED", "DRAIN"}),
        ("IDLE+DRAIN+NOT_RESPONDING", {"IDLE", "DRAIN", "NOT_RESPONDING"}),
        ("DOWN*", {"DOWN", "NOT_RESPONDING"}),
        ("IDLE~", {"IDLE", "POWERED_DOWN"}),
    ],
)
def test_node_states(state: str, states: set[str]) -> None:
    assert parse_node_line(f"NodeName=n1 State={state}").states == states


def test_sinfo_node_line() -> None:
    """``sinfo -h -N -n NODE -O`` (``cli._SINFO_NODE``) as 22.05 printed a powered-down CLOUD node,
    which ``scontrol show node`` no longer finds: taken out by pitcrew, then RESUMEd (no reason
    then: "Unknown", "none"); a reason holding the separator."""
    line = (
        "gpu-003|down+cloud+drain+powered_down|root(0)|2026-12-06T21:17:28|gpu:h100:8|pitcrew: pc-1 XID 79|"
    )
    node = parse_sinfo_node_line(line)
    assert node.states == {"DOWN", "CLOUD", "DRAIN", "POWERED_DOWN"}
    assert (node.reason, node.reason_user, node.gpus) == ("pitcrew: pc-1 XID 79", "root", 8)
    assert node.reason_time is not None and node.taken_out and not node.in_service
    asleep = parse_sinfo_node_line(
        "gpu-003|idle+cloud+powered_down+not_responding|Unknown|Unknown|gpu:h100:8|none|"
    )
    assert asleep.in_service and (asleep.reason, asleep.reason_user, asleep.reason_time) == ("", None, None)
    assert parse_sinfo_node_line("n1|down|bob(1001)|2026-12-06T21:17:28|(null)|a | b|").reason == "a | b"


def test_empty_values_and_keys_with_punctuation() -> None:
    kv = parse_kv(
        "JobId=7 JobName=my run lr=0.1 NodeList= NumNodes=1 AllocNode:Sid=h:1 TRES=cpu=1,node=1 Power="
    )
    assert kv["JobName"] == "my run lr=0.1"
    assert kv["NodeList"] == ""
    assert kv["Power"] == ""
    assert kv["AllocNode:Sid"] == "h:1"
    assert kv["TRES"] == "cpu=1,node=1"


def test_job_line_multi_node_and_no_requeue() -> None:
    job = parse_job_line(
        "JobId=9 JobName=x UserId=alice(1000) JobState=NODE_FAIL Requeue=0 Restarts=0 NodeList=g-[1-3]"
    )
    assert (job.user, job.requeue, job.nodes, job.ended_for_good) == (
        "alice",
        False,
        ("g-1", "g-2", "g-3"),
        True,
    )


# -- REST v0.0.39+ shapes ---------------------------------------------------------------------
def test_v0040_shapes() -> None:
    node = node_from_json(
        {
            "name": "n1",
            "state": ["IDLE", "DRAIN"],
            "reason": "pitcrew: i1 XID 79",
            "reason_changed_at": {"set": True, "infinite": False, "number": 1700000000},
        }
    )
    assert node.states == {"IDLE", "DRAIN"}
    assert is_pitcrew_reason(node.reason)
    assert node.reason_time is not None
    job = job_from_json(
        {
            "job_id": 5,
            "job_state": ["REQUEUED", "PENDING"],
            "nodes": "",
            "restart_cnt": 2,
            "start_time": {"set": False, "infinite": False, "number": 0},
        }
    )
    assert (job.state, job.nodes, job.restarts, job.start_time) == ("PENDING", (), 2, None)


def _doc(*paths: tuple[str, tuple[str, ...]]) -> dict[str, Any]:
    return {"paths": {p: {m: {} for m in methods} for p, methods in paths}}


def test_discovery_prefers_highest_version_with_node_update() -> None:
    doc = _doc(
        ("/slurm/v0.0.39/nodes", ("get",)),
        ("/slurm/v0.0.39/job/{job_id}", ("get", "post", "delete")),
        ("/slurm/v0.0.39/node/{node_name}", ("get", "post", "delete")),
        ("/slurm/v0.0.40/nodes/", ("get", "post")),
        ("/slurm/v0.0.40/jobs/", ("get",)),
        ("/slurm/v0.0.40/job/{job_id}", ("get",)),
        ("/slurm/v0.0.40/node/{node_name}", ("get", "post")),
        ("/slurm/v0.0.41/diag/", ("get",)),  # cannot read nodes: not usable
    )
    api = discover_api(doc)
    assert (api.version, api.node_update, api.versions) == ("v0.0.40", True, ("v0.0.39", "v0.0.40"))
    assert api.path("jobs") == "/slurm/v0.0.40/jobs/"  # the server's own spelling
    assert api.path("job/{job_id}", job_id="1/../x") == "/slurm/v0.0.40/job/1%2F..%2Fx"
    assert discover_api(doc, "v0.0.39").version == "v0.0.39"
    with pytest.raises(ValueError, match="does not offer"):
        discover_api(doc, "v0.0.38")
    with pytest.raises(ValueError, match="no slurm"):
        discover_api(_doc(("/openapi", ("get",))))


def test_discovery_refuses_versions_pitcrew_does_not_know() -> None:
    """A newer slurmrestd's shapes may have moved again: an unknown version is refused by name,
    never read by guesswork; a known one beside it is still chosen."""
    newer = _doc(
        ("/slurm/v0.0.46/nodes/", ("get",)),
        ("/slurm/v0.0.46/job/{job_id}", ("get",)),
        ("/slurm/v0.0.46/node/{node_name}", ("get", "post")),
    )
    with pytest.raises(ValueError) as refused:
        discover_api(newer)
    assert "it offers v0.0.46" in str(refused.value)
    assert "pitcrew knows v0.0.38, v0.0.39, v0.0.40, v0.0.41, v0.0.42, v0.0.43, v0.0.44, v0.0.45" in str(
        refused.value
    )
    with pytest.raises(ValueError, match=r"does not know slurm/v0\.0\.46"):
        discover_api(newer, "v0.0.46")
    both = {
        "paths": {
            **newer["paths"],
            "/slurm/v0.0.45/nodes/": {"get": {}},
            "/slurm/v0.0.45/job/{job_id}": {"get": {}},
        }
    }
    assert (discover_api(both).version, discover_api(both).node_update) == ("v0.0.45", False)


@pytest.mark.parametrize(
    ("text", "kind", "reason"),
    [
        (
            "slurm_load_node error: Unable to contact slurm controller (connect failure)",
            TransientError,
            Reason.UNREACHABLE,
        ),
        ("slurm_update error: Socket timed out on send/recv operation", TransientError, Reason.TIMEOUT),
        ("Node gpu-009 not found", PermanentError, Reason.UNKNOWN_NODE),
        ("slurm_update error: Invalid node name specified", PermanentError, Reason.UNKNOWN_NODE),
        ("slurm_load_jobs error: Invalid job id specified", PermanentError, Reason.UNKNOWN_JOB),
        (
            "You must specify a reason when DOWNING or DRAINING a node. Request denied",
            PermanentError,
            Reason.INVALID_REQUEST,
        ),
        ("slurm_update error: Access/permission denied", PermanentError, Reason.FORBIDDEN),
        # slurmctld's HA takeover: the backup answers until it takes control (errno 2027, 2131)
        ("slurm_update error: Slurm backup controller in standby mode", TransientError, Reason.UNAVAILABLE),
        (
            "slurm_requeue error: Controller is in standby mode, try a different controller",
            TransientError,
            Reason.UNAVAILABLE,
        ),
        ("something nobody has seen", PermanentError, Reason.REFUSED),
    ],
)
def test_failure_classification(text: str, kind: type[Exception], reason: Reason) -> None:
    error = classify_failure("op", text)
    assert type(error) is kind
    assert error.reason == reason
    assert str(error).startswith("op: ")
    assert len(str(error)) <= 210


@pytest.mark.parametrize("name", ["gpu-[001-100]", "gpu-001,gpu-002", "-o", "", "gpu 001", "ALL"])
async def test_only_one_node_is_ever_addressed(name: str) -> None:
    # Refused before any command runs (there is none to run): a hostlist would take a rack down.
    sched = ScontrolScheduler(bin_dir=Path("/nonexistent"))
    with pytest.raises(PermanentError) as caught:
        await sched.down(name, "pitcrew: inc-1 XID 79")
    assert caught.value.reason == Reason.INVALID_REQUEST


@pytest.mark.parametrize("job_id", ["12 13", "-h", "12,13", ""])
async def test_only_one_job_is_ever_addressed(job_id: str) -> None:
    with pytest.raises(PermanentError) as caught:
        await ScontrolScheduler(bin_dir=Path("/nonexistent")).requeue(job_id)
    assert caught.value.reason == Reason.INVALID_REQUEST


@pytest.mark.parametrize(
    ("states", "busy", "taken_out", "in_service"),
    [
        ({"IDLE"}, False, False, True),
        ({"MIXED"}, True, False, True),
        ({"ALLOCATED", "DRAIN"}, True, True, False),  # draining: jobs still run
        ({"COMPLETING"}, True, False, True),
        ({"DOWN"}, False, True, False),
        ({"IDLE", "DRAIN"}, False, True, False),
        ({"IDLE", "NOT_RESPONDING"}, False, False, False),  # Slurm's view: no RESUME of pitcrew's undoes it
        ({"IDLE", "FAIL"}, False, False, False),
        # Power saving: slurmctld pings no node powered down or powering up or down (ping_nodes.c),
        # sets NOT_RESPONDING itself when it wakes one (power_save.c) or RESUMEs a DOWN one
        # (node_mgr.c _require_node_reg), and schedules it all the same: no fault of the node's.
        ({"IDLE", "POWERED_DOWN"}, False, False, True),
        ({"IDLE", "POWERING_DOWN"}, False, False, True),
        ({"IDLE", "POWERED_DOWN", "NOT_RESPONDING"}, False, False, True),  # RESUMEd while powered down
        ({"MIXED", "NOT_RESPONDING", "POWERING_UP"}, True, False, True),  # woken for a job, booting
        ({"IDLE", "CLOUD", "POWERED_DOWN"}, False, False, True),
        ({"DOWN", "DRAIN", "POWERED_DOWN"}, False, True, False),  # pitcrew's DOWN, then suspended
        ({"DOWN", "POWERED_DOWN"}, False, True, False),  # ResumeTimeout reached: Slurm's own DOWN
    ],
)
def test_node_state_rules(states: set[str], busy: bool, taken_out: bool, in_service: bool) -> None:
    """Each rule on a node's states is one property: jobs on it (``busy``), out of service by a
    DOWN or DRAIN that a RESUME undoes (``taken_out``), and in service."""
    node = SlurmNodeState("gpu-001", frozenset(states))
    assert (node.busy, node.taken_out, node.in_service) == (busy, taken_out, in_service)
