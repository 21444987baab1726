"""``scripts/demo`` run exactly as a user runs it: a subprocess, plain output, then checked from outside.

Each scenario runs ``python -m proving_ground --scenario S --keep --json-summary PATH`` (the demo
stays up after its summary so the outcome can be read from pitcrew's own read API and from the
real Slurm cluster), then gets SIGINT, as a Ctrl-C would send, and must exit with no process of
its run left. Cases:

* ``xid79``: the incident is resolved; pitcrew's ``confirm_resumed`` says the job resumed on
  another node; Slurm runs the job there with its restart count raised, and the job's own
  progress file shows it resumed from (at least) the checkpoint it had at the fault; the Slack
  stand-in holds the incident's thread (parent, one reply per step, the summary sent to the
  channel) and the transcript file reads the same; the Kubernetes API emulator logged the
  cordon, the eviction and one Machine delete, and (asked over HTTP) no longer has the node but
  its Ready successor, which is the node pitcrew's ``wait_ready`` found, with the DaemonSet and
  mirror pods left on the old node;
* ``approve``: the demo clicks Approve in the stand-in; the signed click reached pitcrew, whose
  audit log holds the approval by the Slack user (``slack:U0ALICE``); the incident then resolves;
* ``app-xid``: an XID 13 incident with the ``notify-only`` playbook, a notice, no node step,
  no action, and no write request at the Kubernetes API emulator; Slurm still runs the job where it was, never restarted, its node in service; its
  Slack thread asks no approval; it runs with ``--store postgres`` (pitcrew on a throwaway
  PostgreSQL the demo starts and removes: nothing listens on its port afterwards);
* ``storm``: twenty incidents, exactly the breaker's limit acted on (a Slurm DOWN each, a
  Machine deleted each), every other one suppressed, one breaker notice counting the fleet
  from Kubernetes; Slurm has every node back in service; the channel
  shows one storm digest and no message of its own for any held node;
* Ctrl-C while the xid79 incident is under way: the demo exits 130 and leaves no process behind;
* a ``--keep`` demo whose starter is SIGKILLed (a killed test run) stops everything by itself;
* ``xid79`` with ``--slurm 24.11``: the same loop on Slurm 24.11 from its Debian 13 root, read
  back through that Slurm's own ``scontrol``; nothing of the run is left in the root afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from proving_ground.kubernetes.emulator import AUTH_HEADER
from proving_ground.proc import port_free
from proving_ground.scenarios import BREAKER_NODES
from proving_ground.slurm_root import DEFAULT_VERSION, root_path
from proving_ground.train_job import read_progress
from tests.harness.postgres import require_postgres
from tests.harness.proc import process_state, require_binary, wait_until
from tests.harness.slurm import require_slurm

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
NODE_STEPS = {"slurm_down", "slurm_drain", "cordon", "drain", "replace", "reboot", "reset_gpu"}
#: Seconds a scenario may take after its fault (the demo's ``--timeout``), and seconds a test waits
#: for the summary (the start of every server included): minutes on a loaded CI machine, within
#: the e2e limit of ``tests/harness/timeouts.py`` with the Ctrl-C after it.
SCENARIO = 200
SUMMARY = 300.0


class Demo:
    """One ``scripts/demo`` subprocess and what it wrote."""

    def __init__(
        self,
        tmp: Path,
        scenario: str,
        *,
        keep: bool = True,
        interactive: bool = False,
        slurm: str | None = None,
        store: str | None = None,
    ) -> None:
        require_slurm(slurm or DEFAULT_VERSION)
        if store == "postgres":
            require_postgres()
        require_binary("prometheus", "prometheus")
        require_binary("prometheus-alertmanager", "prometheus-alertmanager")
        self.summary_path = tmp / f"{scenario}.json"
        self.output = tmp / f"{scenario}.out"
        argv = [sys.executable, "-m", "proving_ground", "--scenario", scenario, "--plain"]
        argv += ["--json-summary", str(self.summary_path), "--replace-delay", "2", "--timeout", str(SCENARIO)]
        argv += ["--keep"] if keep else []
        argv += ["--interactive"] if interactive else []
        argv += ["--slurm", slurm] if slurm else []
        argv += ["--store", store] if store else []
        with self.output.open("wb") as out:
            self.process = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(os.environ),
                cwd=REPO,
                preexec_fn=as_in_a_terminal,
            )
        self.summary: dict[str, Any] = {}

    def text(self) -> str:
        return self.output.read_text(errors="replace")

    def wait_summary(self, timeout: float = SUMMARY) -> dict[str, Any]:
        def written() -> bool:
            assert self.process.poll() is None, f"demo exited {self.process.returncode}:\n{self.text()}"
            return self.summary_path.exists()

        wait_until(written, timeout=timeout, interval=0.2, what=f"the demo's summary\n{self.text()}")
        self.summary = json.loads(self.summary_path.read_text())
        return self.summary

    def interrupt(self, timeout: float = 60) -> int:
        """SIGINT, as Ctrl-C in its terminal sends (its servers run in sessions of their own)."""
        self.process.send_signal(signal.SIGINT)
        return self.process.wait(timeout=timeout)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    # ------------------------------------------------------------------ looking from outside
    def read(self, path: str) -> Any:
        request = urllib.request.Request(
            self.summary["pitcrew_url"] + path,
            headers={"Authorization": f"Bearer {self.summary['read_token']}"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def incident(self, incident_id: str) -> dict[str, Any]:
        return dict(self.read(f"/api/v1/incidents/{incident_id}?events_limit=200&alerts_limit=200"))

    def slurm(self, *argv: str) -> str:
        env = {**os.environ, "SLURM_CONF": self.summary["slurm_conf"], "LC_ALL": "C"}
        if self.summary.get("slurm_bin_dir"):  # that Slurm's own client, inside its root
            argv = (str(Path(self.summary["slurm_bin_dir"]) / argv[0]), *argv[1:])
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=15, check=True).stdout

    def kube(self, path: str) -> Any:
        """A GET at the demo's Kubernetes API emulator, as kubectl would send it."""
        request = urllib.request.Request(self.summary["kubernetes_api"] + path, headers=AUTH_HEADER)
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def job(self, job_id: str) -> dict[str, str]:
        line = self.slurm("scontrol", "show", "job", "-o", job_id).strip()
        return dict(field.split("=", 1) for field in line.split() if "=" in field)


def as_in_a_terminal() -> None:
    """In the demo's process before it starts: Ctrl-C works, as in a user's terminal, even when
    the test run itself was started with SIGINT ignored (a background job of a script)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def leftovers(marker: str) -> list[str]:
    """Live processes whose command line or environment names the run directory."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            blob = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
            zombie = (entry / "stat").read_text().split(") ", 1)[-1].startswith("Z")
            comm = (entry / "comm").read_text().strip()
        except OSError:
            continue
        if marker.encode() in blob and not zombie:
            found.append(f"{entry.name} {comm}")
    return found


@pytest.fixture
def demo(tmp_path: Path) -> Any:
    started: list[Demo] = []

    def start(scenario: str, **kwargs: Any) -> Demo:
        started.append(Demo(tmp_path, scenario, **kwargs))
        return started[-1]

    yield start
    for d in started:
        # A failed test leaves its demo up: Ctrl-C stops its servers (they run in sessions of their
        # own, so a SIGKILL of the demo alone would leave them behind); SIGKILL only if that hangs.
        if d.process.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                d.interrupt()
        d.kill()


def stopped_cleanly(d: Demo, expected: int = 0) -> None:
    status = d.interrupt()
    assert status == expected, d.text()
    assert "no process of the demo is left" in d.text()
    assert leftovers(d.summary["workdir"]) == []


def test_xid79_job_resumes_from_its_checkpoint(demo: Any) -> None:
    d = demo("xid79")
    summary = d.wait_summary()
    assert summary["exit_status"] == 0, d.text()
    incident = d.incident(summary["incident_id"])
    assert incident["state"] == "resolved"
    [resumed] = next(s for s in incident["step_records"] if s["step"] == "confirm_resumed")["result"]["jobs"]
    assert resumed["job_id"] == summary["job_id"] and resumed["status"] == "resumed"
    assert summary["job_node"] not in resumed["new_nodes"]
    job = d.job(summary["job_id"])
    assert job["JobState"] == "RUNNING" and int(job["Restarts"]) >= 1, job
    assert job["NodeList"] != summary["job_node"]
    progress = read_progress(Path(summary["workdir"]) / "slurm" / "train", summary["job_id"])
    assert progress is not None and progress["resumed_from"] >= summary["checkpoint_at_fault"] > 0
    assert progress["step"] > progress["resumed_from"]
    for stage in ("detection", "decision", "slurm", "replacement wait", "job restart"):
        assert summary["stages"][stage] > 0, summary["stages"]
    assert "job past its checkpoint" in d.text() and "incident closed" in d.text()
    thread = summary["thread"]
    assert f"{summary['job_node']}: XID 79" in thread[0] and "[Rollback]" in thread[0], thread[0]
    for step in ("slurm_down", "cordon", "drain", "replace", "wait_ready", "confirm_resumed", "close"):
        assert [t for t in thread[1:] if f"{step}: ok" in t], (step, thread)
    [closing] = [t for t in thread if "(also sent to the channel)" in t]
    assert "replace-node finished" in closing
    assert summary["milestones"]["notified"]["detail"].startswith("#gpu-ops:")
    transcript = Path(summary["slack_transcript"]).read_text()
    assert "Status:* resolved " in thread[0], thread[0]  # the demo waited for the parent's last edit
    assert thread[0].splitlines()[0] in transcript and "Slack thread, as people read it" in d.text()
    assert f"Slack         {summary['slack_transcript']}" in d.text()  # --keep says where it is
    # Kubernetes: the emulator saw pitcrew cordon the node, evict its worker and delete its Machine
    # (once); the MachineSet's new node is Ready and is the one pitcrew waited for; the DaemonSet
    # and mirror pods were left where they were.
    node = summary["job_node"]
    calls = summary["node_calls"][node]
    assert [c for c in calls if c in ("cordon", "evict", "replace")] == ["cordon", "evict", "replace"], calls
    assert summary["kubernetes_requests"]["delete machines"] == 1
    successor = summary["kubernetes_successors"][node]
    ready = next(s for s in incident["step_records"] if s["step"] == "wait_ready")["result"]
    assert ready["node"] == successor
    nodes = {n["metadata"]["name"]: n for n in d.kube("/api/v1/nodes")["items"]}
    assert node not in nodes and successor in nodes
    assert {"type": "Ready", "status": "True"}.items() <= next(
        c for c in nodes[successor]["status"]["conditions"] if c["type"] == "Ready"
    ).items()
    left = d.kube(f"/api/v1/pods?fieldSelector=spec.nodeName%3D{node}")["items"]
    assert sorted(p["metadata"]["name"] for p in left) == [
        f"gpu-health-agent-{node}",
        f"node-exporter-{node}",
    ]
    assert f"Kubernetes    API emulator {summary['kubernetes_api']}" in d.text()
    stopped_cleanly(d)


def test_approve_goes_through_a_signed_slack_click(demo: Any) -> None:
    d = demo("approve")
    summary = d.wait_summary()
    assert summary["exit_status"] == 0, d.text()
    assert summary["approved_by"] == "slack:U0ALICE"
    incident = d.incident(summary["incident_id"])
    assert incident["state"] == "resolved"
    [approval] = [e for e in incident["events"] if e["kind"] == "approved"]
    assert approval["actor"] == "slack:U0ALICE"
    assert "alice (U0ALICE) clicked Approve" in d.text()
    assert "approved by @alice" in summary["thread"][0]
    transcript = Path(summary["slack_transcript"]).read_text()
    assert f"(only alice sees this) {summary['incident_id']} approved by slack:U0ALICE" in transcript
    stopped_cleanly(d)


def test_interactive_approve_waits_for_the_users_own_click(demo: Any) -> None:
    d = demo("approve", interactive=True)
    wait_until(lambda: "or click it in Slack:" in d.text(), timeout=120, interval=0.2, what=d.text())
    line = next(x for x in d.text().splitlines() if "or click it in Slack:" in x)
    incident_id = line.split("--click approve ", 1)[1].split()[0]

    def click(user: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "proving_ground", "--click", "approve", incident_id, "--user", user]
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=60, env=dict(os.environ), cwd=REPO
        )

    refused = click("U0MALLORY")
    assert refused.returncode == 0, refused
    assert "told U0MALLORY (only they see it): Sorry <@U0MALLORY>" in refused.stdout, refused.stdout
    approved = click("U0ALICE")
    assert approved.returncode == 0, approved
    assert "pitcrew answered HTTP 200" in approved.stdout
    assert f"{incident_id} approved by slack:U0ALICE" in approved.stdout
    summary = d.wait_summary()
    assert summary["exit_status"] == 0 and summary["approved_by"] == "slack:U0ALICE", d.text()
    events = d.incident(incident_id)["events"]
    assert [e["actor"] for e in events if e["kind"] == "approve_refused"] == ["slack:U0MALLORY"]
    assert [e["actor"] for e in events if e["kind"] == "approved"] == ["slack:U0ALICE"]
    stopped_cleanly(d)


def test_app_xid_notifies_and_touches_nothing(demo: Any) -> None:
    d = demo("app-xid", store="postgres")  # scripts/demo --store postgres: a throwaway cluster
    summary = d.wait_summary()
    assert summary["exit_status"] == 0, d.text()
    incident = d.incident(summary["incident_id"])
    assert incident["playbook"] == "notify-only"
    assert [f["xid"] for f in incident["faults"]] == [13]
    kinds = [(e["kind"], e["step"]) for e in incident["events"]]
    assert ("step_finished", "notify") in kinds
    assert not [s for k, s in kinds if k == "step_started" and s in NODE_STEPS]
    assert not [e for e in incident["events"] if e["kind"] == "action"]
    assert summary["node_calls"] == {summary["job_node"]: []}
    # Nothing but reads reached the Kubernetes API emulator (its own request log).
    verbs = {request.split()[0] for request in summary["kubernetes_requests"]}
    assert verbs <= {"get", "list", "watch"}, summary["kubernetes_requests"]
    job = d.job(summary["job_id"])
    assert (job["JobState"], job["NodeList"], job["Restarts"]) == ("RUNNING", summary["job_node"], "0")
    state = d.slurm("sinfo", "-h", "-n", summary["job_node"], "-o", "%T").strip()
    assert state in {"allocated", "mixed"}, state
    assert f"{summary['job_node']}: XID 13" in summary["thread"][0]
    assert "[Approve]" not in "".join(summary["thread"])  # nothing waits for a human
    [port] = re.findall(r"store PostgreSQL on 127\.0\.0\.1:(\d+) \(removed with the demo\)", d.text())
    assert (
        '"logger": "pitcrew.store.postgres"'
        in (Path(summary["workdir"]) / "pitcrew" / "pitcrew.log").read_text()
    )
    stopped_cleanly(d)
    assert port_free(int(port)), f"PostgreSQL still listens on {port} after the demo stopped"


def test_storm_is_held_to_the_breaker_limit(demo: Any) -> None:
    d = demo("storm")
    summary = d.wait_summary()
    assert summary["exit_status"] == 0, d.text()
    incidents = [d.incident(i) for i in summary["incident_ids"].values()]
    assert len(incidents) == 20
    downed = [i for i in incidents if any(e["data"].get("action") == "slurm_down" for e in i["events"])]
    assert len(downed) == BREAKER_NODES
    assert all(i["state"] == "resolved" for i in downed)
    assert sorted(i["state"] for i in incidents if i not in downed) == ["suppressed"] * (20 - BREAKER_NODES)
    assert sum("circuit breaker opened" in text for text in summary["thread"]) == 1
    # The breaker counted the fleet from Kubernetes (the emulator's 20 GPU nodes).
    [breaker] = [t for t in summary["thread"] if "circuit breaker opened" in t]
    assert "fleet of 20 nodes from Kubernetes" in breaker, breaker
    acted = {i["node"] for i in downed}
    assert {n for n, calls in summary["node_calls"].items() if calls} == acted
    assert summary["kubernetes_requests"]["delete machines"] == BREAKER_NODES
    # The channel: one digest for the storm; a thread and a closing summary per acted node only
    # (an acted incident whose notice came once the digest had started is shown there instead).
    channel = summary["channel"]
    assert (channel["digest"], channel["breaker"]) == (1, 1)
    assert channel["summaries"] <= BREAKER_NODES  # the others' ends are told in the digest
    assert channel["messages"] <= 2 * BREAKER_NODES + 2, summary["thread"]
    [digest] = [t for t in summary["thread"] if "GPU fault storm: 20 nodes" in t]
    held = [i for i in incidents if i not in downed]
    assert all(f"{i['node']} ({i['id']})" in digest for i in held)
    states = d.slurm("sinfo", "-h", "-N", "-o", "%N %T").split("\n")
    assert len([s for s in states if s.strip()]) == 20
    assert not [s for s in states if any(w in s for w in ("down", "drain", "fail"))], states
    stopped_cleanly(d)


def test_ctrl_c_in_the_middle_leaves_nothing_behind(demo: Any) -> None:
    d = demo("xid79", keep=False)
    wait_until(
        lambda: "Slurm node DOWN" in d.text(), timeout=120, interval=0.1, what=f"the incident\n{d.text()}"
    )
    workdir = next(line.split()[-1] for line in d.text().splitlines() if "run directory" in line)
    assert d.interrupt() == 130, d.text()
    assert "no process of the demo is left" in d.text()
    assert leftovers(workdir) == []


def test_a_kept_demo_whose_starter_dies_stops_everything(tmp_path: Path) -> None:
    """A test run (or terminal) killed while its ``--keep`` demo is up leaves no server behind."""
    require_slurm()
    summary_path, output = tmp_path / "app-xid.json", tmp_path / "app-xid.out"
    argv = [sys.executable, "-m", "proving_ground", "--scenario", "app-xid", "--plain", "--keep"]
    argv += ["--json-summary", str(summary_path), "--timeout", str(SCENARIO)]
    starter_code = (
        "import subprocess, sys; "
        f"p = subprocess.Popen({argv!r}, stdout=open({str(output)!r}, 'wb'), stderr=subprocess.STDOUT); "
        "print(p.pid, flush=True); p.wait()"
    )
    starter = subprocess.Popen(
        [sys.executable, "-c", starter_code],
        stdout=subprocess.PIPE,
        env=dict(os.environ),
        cwd=REPO,
        preexec_fn=as_in_a_terminal,
    )
    assert starter.stdout is not None
    pid = int(starter.stdout.readline())

    def ended() -> bool:
        return process_state(pid) in (None, "Z")

    try:
        # Until the summary is written, or the demo has ended without one (then at once, with its output).
        wait_until(
            lambda: summary_path.exists() or ended(), timeout=SUMMARY, interval=0.2, what="the demo's summary"
        )
        assert summary_path.exists(), f"the demo ended without its summary:\n{output.read_text()}"
        wait_until(lambda: "Stop it with Ctrl-C" in output.read_text(), timeout=30, interval=0.1)
        starter.kill()  # as a killed test runner would be: no Ctrl-C reaches the demo
        starter.wait()

        wait_until(
            ended,
            timeout=60,
            interval=0.2,
            what=f"the orphaned demo to stop\n{output.read_text()}",
        )
        text = output.read_text()
        assert "is gone: stopping everything" in text and "no process of the demo is left" in text, text
        assert leftovers(json.loads(summary_path.read_text())["workdir"]) == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGINT)
        starter.kill()


def test_xid79_on_slurm_24_11(demo: Any) -> None:
    d = demo("xid79", slurm="24.11")
    summary = d.wait_summary()
    assert summary["exit_status"] == 0, d.text()
    assert summary["slurm_version"] == "24.11"
    assert "Slurm 24.11: munge, slurmctld and 3 slurmd" in d.text()
    job = d.job(summary["job_id"])
    assert job["JobState"] == "RUNNING" and int(job["Restarts"]) >= 1, job
    assert job["NodeList"] != summary["job_node"]
    node = d.slurm("scontrol", "show", "node", "-o", summary["job_node"])
    assert "Version=24.11" in node, node
    progress = read_progress(Path(summary["workdir"]) / "slurm" / "train", summary["job_id"])
    assert progress is not None and progress["resumed_from"] >= summary["checkpoint_at_fault"] > 0
    assert progress["step"] > progress["resumed_from"]
    assert "job past its checkpoint" in d.text() and "incident closed" in d.text()
    stopped_cleanly(d)
    root = root_path("24.11")
    assert root is not None
    assert not (root / summary["workdir"].lstrip("/")).exists()  # its mount point is gone too
