"""A real Slurm cluster on this machine: munge, slurmctld, slurmd gpu-001..003, slurmrestd.

Debian 12's Slurm 22.05 packages, or (``version="24.11"``, ``"26.05"``) a newer Slurm from a
Debian root under chroot (``proving_ground.slurm_root``), configured as in ``../shared/notes/slurm.md``: every daemon
runs in the foreground under a per-run directory (config, state, spool, logs, fake GPU
devices, a private ``munged`` on its own socket), on free loopback ports, so a run never
touches the machine's own Slurm or munge. Fast requeue: ``AuthInfo=cred_expire=5`` and
``sched_interval=1`` bring a requeued job back in ~6 s instead of ~2 min.

With ``nodeset=`` the cluster has a Slinky NodeSet (``_DYNAMIC``): its static nodes carry the
NodeSet's feature, and ``start_dynamic`` starts a slurmd that registers a new Slurm node at run time
(``slurmd -Z``), as slurm-operator's NodeSet pods do; ``stop_slurmd`` ends a node's slurmd for good.

slurmrestd refuses to run as root: it runs as the ``slurm`` system user the packages create
or, where that is missing, as ``pitcrew-rest``, which ``rest_user()`` adds once with
``useradd --system`` (idempotent).

Use ``SlurmCluster(run_dir).start()`` / ``.stop()`` anywhere (``python -m
proving_ground.slurm`` starts one and waits for Ctrl-C; ``scripts/demo`` and the tests' fixtures in
``tests.harness.slurm`` use it). ``missing_binaries()`` names what is not installed. ``stop`` cancels jobs, SIGTERMs every
daemon by its recorded pid (SIGKILL after a grace period) and fails if any process that
refers to the run directory survives.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from string import Template

from bot.domain.jobs import JobSnapshot, SlurmNodeState
from bot.integrations.slurm.cli import parse_job_line, parse_node_line
from proving_ground.proc import (
    DemoError,
    find_binary,
    free_port,
    free_ports,
    renew_claims,
    stop_process,
    tail,
)
from proving_ground.slurm_root import DEFAULT_VERSION, SlurmRoot, chosen_version, root_missing, root_path

NODES = ("gpu-001", "gpu-002", "gpu-003")
TRAIN_JOB = Path(__file__).resolve().parent / "train_job.py"
_DAEMONS = frozenset({"munged", "slurmctld", "slurmd", "slurmstepd", "slurmrestd", "slurmscriptd"})
BINARIES = {
    "munged": "munge",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "slurmrestd": "slurmrestd",
    "scontrol": "slurm-client",
    "sbatch": "slurm-client",
}

# As measured in ../shared/notes/slurm.md, plus a private munge socket and free ports.
_SLURM_CONF = Template("""\
ClusterName=pitcrew
SlurmctldHost=localhost
SlurmctldPort=$ctld_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$run/munge/munge.sock,cred_expire=5
CredType=cred/munge
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=$run/jwt_hs256.key
StateSaveLocation=$run/state
SlurmdSpoolDir=$run/spool/%n
SlurmctldPidFile=$run/slurmctld.pid
SlurmdPidFile=$run/slurmd-%n.pid
SlurmctldLogFile=$run/log/slurmctld.log
SlurmdLogFile=$run/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$run/log/jobcomp.log
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=$return_to_service
JobRequeue=1
MinJobAge=300
KillWait=5
MpiDefault=none
MailProg=/bin/true
GresTypes=gpu
$dynamic_nodes
NodeName=DEFAULT CPUs=2 RealMemory=2048 Gres=gpu:h100:8 State=UNKNOWN
$node_lines
PartitionName=gpu Nodes=$node_list Default=YES MaxTime=INFINITE State=UP
""")


#: What a cluster with a Slinky NodeSet (``nodeset=``) adds, after SchedMD's ``dynamic_nodes.shtml``
#: (22.05): room in the node table for nodes made at run time (``MaxNodeCount``, which slurm-operator
#: sets to 1024, ``controller_config.go``), no fan-out through slurmds (``TreeWidth=65533``: they do
#: not know the dynamic nodes), and the NodeSet as slurm-operator writes it (``buildNodeSetConf``:
#: ``NodeSet=<name> Feature=<name>``, its partition ``Nodes=<name>``), so a node registering with that
#: feature joins the partition. A dynamic node's slurmd listens on ``SlurmdPort`` (its ``--conf``
#: may not set ``Port=``: slurmd.c ``_validate_dynamic_conf``), so one host runs one at a time.
#: ``SlurmdTimeout=10`` unless the cluster says otherwise (``slurmd_timeout``): a record whose slurmd
#: went with its machine shows NOT_RESPONDING within seconds instead of Slurm's default 300 s.
_DYNAMIC = Template("""\
MaxNodeCount=$max_nodes
TreeWidth=65533
SlurmdTimeout=$slurmd_timeout
SlurmdPort=$slurmd_port
NodeSet=$nodeset Feature=$nodeset""")
#: A dynamic node's ``--conf``: the static nodes' shape (``NodeName=DEFAULT``), the NodeSet's feature
#: (slurm-operator's ``slurmdConfArgs``: ``Features=<nodeset>``).
_DYNAMIC_CONF = "CPUs=2 RealMemory=2048 Gres=gpu:h100:8 Features={nodeset}"


#: slurmctld's log line for each node state change it was asked for (``node_mgr.c`` ``update_node``;
#: a DRAIN is logged DRAINED on a node without jobs, DRAINING on one with them).
NODE_UPDATE = re.compile(r"update_node: node (\S+) state set to (\S+)")


class SlurmHarnessError(DemoError):
    """The cluster did not start, reset or stop as expected (logs attached)."""


def rest_user() -> str:
    """A non-root user for slurmrestd, created once if the packages did not make one."""
    for name in ("slurm", "pitcrew-rest"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "pitcrew-rest"],
        check=False,
        capture_output=True,
    )
    pwd.getpwnam("pitcrew-rest")  # raises if useradd failed: say so rather than run as root
    return "pitcrew-rest"


class SlurmCluster:
    """One throw-away cluster under ``run_dir``."""

    def __init__(
        self,
        run_dir: Path,
        *,
        nodes: tuple[str, ...] = NODES,
        rest: bool = True,
        version: str | None = None,
        nodeset: str | None = None,
        return_to_service: int = 1,
        slurmd_timeout: int = 10,
    ) -> None:
        self.run_dir = run_dir
        self.version = chosen_version(version)
        root = root_path(self.version)
        self._root = SlurmRoot(root, run_dir) if root is not None else None
        self.nodes = nodes
        #: A Slinky NodeSet (its name, also its feature) the static nodes belong to and dynamic nodes
        #: (``start_dynamic``) join; ``None``: static nodes only, the partition names them.
        self.nodeset = nodeset
        #: slurm.conf's ``ReturnToService``: 1 (the proving ground's default) returns a DOWN node when
        #: its slurmd registers only if Slurm itself set it DOWN "Not responding"; 0 never (Slurm's own
        #: default, which slurm-operator's chart keeps); 2 whatever the reason (node_mgr.c
        #: ``validate_node_specs``).
        self.return_to_service = return_to_service
        #: A NodeSet cluster's ``SlurmdTimeout``. slurmctld pings a slurmd only once its last answer is
        #: a third of that old (ping_nodes.c ``ping_nodes``: ``still_live_time``), so a record whose
        #: slurmd stopped shows NOT_RESPONDING from its ping no sooner. slurm-operator writes none:
        #: Slurm's 300 s is a Slinky cluster's.
        self.slurmd_timeout = slurmd_timeout
        #: Dynamic nodes whose slurmd this object started (``start_dynamic``), in order.
        self.dynamic: list[str] = []
        self.with_rest = rest
        self.conf = run_dir / "etc" / "slurm.conf"
        self.job_dir = run_dir / "train"
        self.token_file = run_dir / "rest.token"
        self.rest_port = 0  # chosen with the cluster's other ports when it starts (_write_files)
        self._ports: list[int] = []  # slurmctld's and the slurmds', renewed at each of their restarts
        self.started_in: float | None = None  # seconds from start() to every node IDLE
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    # -- environment -------------------------------------------------------------------
    @property
    def env(self) -> dict[str, str]:
        """Environment for Slurm commands against this cluster (no SLURM_JWT: it breaks sbatch)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env.update(SLURM_CONF=str(self.conf), LC_ALL="C")
        return env

    @property
    def rest_url(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    @property
    def bin_dir(self) -> Path | None:
        """Where this cluster's ``scontrol``/``squeue`` are for pitcrew (``slurm.bin_dir``); ``None``: PATH."""
        return self._root.bin_dir if self._root is not None else None

    @property
    def train_job(self) -> Path:
        """The training job's script as this cluster's jobs see it (a root sees the run directory only)."""
        return self.run_dir / TRAIN_JOB.name

    @property
    def job_python(self) -> str:
        """The Python this cluster's jobs can run: a root's own for a newer Slurm, this one's for 22.05."""
        return "python3" if self._root is not None else sys.executable

    def command(self, *argv: str) -> list[str]:
        """``argv`` as it runs against this cluster's Slurm (inside its root for a newer Slurm)."""
        return self._root.command(*argv) if self._root is not None else list(argv)

    def run(self, *argv: str, check: bool = True, timeout: float = 15) -> subprocess.CompletedProcess[str]:
        """Run a Slurm command against this cluster."""
        proc = subprocess.run(
            self.command(*argv), env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and proc.returncode != 0:
            raise SlurmHarnessError(f"{' '.join(argv)} failed: {proc.stderr.strip() or proc.stdout.strip()}")
        return proc

    # -- lifecycle -----------------------------------------------------------------------
    def start(self, timeout: float = 20) -> SlurmCluster:
        began = time.monotonic()
        if (missing := root_missing(self.version)) is not None:
            raise SlurmHarnessError(missing)
        try:
            self._write_files()
            if self._root is not None:
                self._root.start()
            munge, key = self.run_dir / "munge", self.run_dir / "munge-key"
            self._spawn(
                "munged",
                [
                    "munged",
                    "-F",
                    f"--socket={munge}/munge.sock",
                    f"--key-file={key}/munge.key",
                    f"--pid-file={munge}/munged.pid",
                    f"--seed-file={key}/munged.seed",
                    f"--log-file={self.run_dir}/log/munged.log",
                    *(["--force"] if self._root is not None else []),  # it cannot look up its origin there
                ],
            )
            self._wait(lambda: (self.run_dir / "munge" / "munge.sock").exists(), timeout, "munged socket")
            self.start_controller(timeout)
            for node in self.nodes:
                self._spawn(f"slurmd-{node}", ["slurmd", "-D", "-N", node])
            self.wait_idle(timeout)
            self.started_in = time.monotonic() - began
            if self.with_rest:
                self.start_rest(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def start_controller(self, timeout: float = 20) -> None:
        self._spawn("slurmctld", ["slurmctld", "-D"])
        self._wait(self.ping, timeout, "slurmctld to answer ping")
        if all(f"slurmd-{n}" in self._procs for n in self.nodes):
            # Restarted controller: wait until every slurmd has re-registered with it.
            self._wait(
                lambda: "unknown" not in self.node_states().values(), timeout, "slurmd re-registration"
            )

    def stop_controller(self) -> None:
        """SIGTERM slurmctld (it saves state first) and wait until it is gone."""
        renew_claims(*self._ports)  # free until ``start_controller``: no other server's choice meanwhile
        self._terminate("slurmctld")

    def restart_slurmd(self, node: str, timeout: float = 20) -> None:
        """Stop and start one node's slurmd, as a repair, reboot or replacement of the node does."""
        before = self.node(node).slurmd_started_at
        time.sleep(1.1)  # Slurm keeps the start time in whole seconds: the new one must differ
        renew_claims(*self._ports)
        self._terminate(f"slurmd-{node}")
        self._spawn(f"slurmd-{node}", ["slurmd", "-D", "-N", node])
        self._wait(
            lambda: (started := self.node(node).slurmd_started_at) is not None and started != before,
            timeout,
            f"slurmd on {node} to register again",
        )

    def start_dynamic(self, node: str, timeout: float = 20) -> None:
        """Start a slurmd that registers ``node`` as a dynamic node of the NodeSet, as slurm-operator's
        NodeSet pod runs it (``slurmd -Z --conf 'Features=<nodeset>'``, ``worker_app.go``
        ``slurmdArgs``): slurmctld adds the node when it registers (node_mgr.c
        ``create_dynamic_reg_node``) and it joins the NodeSet's partition by that feature. Its
        GPUs are written to gres.conf first (its slurmd reads the file when it starts). Returns once
        Slurm knows the node and its slurmd answers."""
        if self.nodeset is None:
            raise SlurmHarnessError(
                "a dynamic node needs a cluster with a NodeSet (SlurmCluster(nodeset=...))"
            )
        if running := [n for n in self.dynamic if f"slurmd-{n}" in self._procs]:
            raise SlurmHarnessError(f"one dynamic slurmd at a time on SlurmdPort: {running[0]} runs")
        _fake_gpus(self.run_dir / "dev" / node)
        (self.run_dir / "spool" / node).mkdir(exist_ok=True)
        with (self.run_dir / "etc" / "gres.conf").open("a") as gres:
            gres.write(self._gres(node) + "\n")
        self.dynamic.append(node)
        conf = _DYNAMIC_CONF.format(nodeset=self.nodeset)
        self._spawn(f"slurmd-{node}", ["slurmd", "-D", "-Z", "-N", node, "--conf", conf])
        self._wait(
            lambda: self.node_states().get(node, "").rstrip("*~#%$@!^-") == "idle",
            timeout,
            f"dynamic node {node} to register",
        )

    def stop_slurmd(self, node: str) -> None:
        """Stop ``node``'s slurmd for good, as its machine going away does (a replaced node)."""
        self._terminate(f"slurmd-{node}")

    def start_slurmd_again(self, node: str, timeout: float = 20) -> None:
        """Start the slurmd ``stop_slurmd`` stopped, under the same name and as it ran (a dynamic
        node's with ``-Z``), as a reboot in place or a StatefulSet-mode NodeSet's replica made again
        does; returns once it has registered (a new slurmd start time), whatever state Slurm then
        gives the node."""
        before = self.node(node).slurmd_started_at
        time.sleep(1.1)  # Slurm keeps the start time in whole seconds: the new one must differ
        if node in self.dynamic:
            conf = _DYNAMIC_CONF.format(nodeset=self.nodeset)
            self._spawn(f"slurmd-{node}", ["slurmd", "-D", "-Z", "-N", node, "--conf", conf])
        else:
            self._spawn(f"slurmd-{node}", ["slurmd", "-D", "-N", node])
        self._wait(
            lambda: (started := self.node(node).slurmd_started_at) is not None and started != before,
            timeout,
            f"slurmd on {node} to register again",
        )

    def start_rest(self, timeout: float = 20) -> None:
        env = self.env | {"SLURM_JWT": "daemon"}
        if self._root is None:
            argv = ["slurmrestd", "-a", "rest_auth/jwt", "-u", rest_user(), "-s", "openapi/v0.0.38"]
        else:
            # a newer Slurm serves every data parser it has (24.11: v0.0.40 to v0.0.42, 26.05: v0.0.42
            # to v0.0.45) under openapi/slurmctld;
            # the root's packages made its ``slurm`` user.
            argv = ["slurmrestd", "-a", "rest_auth/jwt", "-u", "slurm", "-s", "openapi/slurmctld"]
        for _ in range(3):
            self._spawn("slurmrestd", [*argv, f"127.0.0.1:{self.rest_port}"], env=env, check=False)
            self.write_token()
            self._wait(self._rest_answers, timeout, "slurmrestd")
            if self._procs["slurmrestd"].poll() is None:
                return
            # It could not listen: another server took the port after it was chosen (a busy
            # machine's slurmrestd can take longer than _spawn's first look to find that out).
            self._procs.pop("slurmrestd")
            self.rest_port = free_port()
        raise SlurmHarnessError(f"slurmrestd found no free port to listen on\n{self.logs()}")

    def stop(self) -> None:
        """Cancel all jobs, stop every daemon, and fail if anything of ours survives."""
        if "slurmctld" in self._procs and self.ping():
            self.run("scancel", "--full", "--user=root", check=False)
            # Long enough for a busy machine: a job still ending when its slurmd stops outlives it.
            # Its processes too: a job leaves squeue before its slurmstepd has ended what it ran,
            # and stopping slurmd then left a job's ``sleep 300`` behind, reparented (a CI run).
            self._wait(
                lambda: not self.active_jobs() and not self.survivors(jobs=True),
                30,
                "jobs to end",
                fail=False,
            )
        slurmds = [f"slurmd-{n}" for n in (*self.nodes, *self.dynamic)]
        for name in ["slurmrestd", *slurmds, "slurmctld", "munged"]:
            self._terminate(name)
        survivors = self.survivors()
        named = {pid: _named(pid) for pid in survivors}  # before the kill: what each was
        for pid in survivors:
            _kill(pid, signal.SIGKILL)
        if self._root is not None:
            survivors += [pid for pid in self._root.stop() if pid not in survivors]
        if survivors:
            which = "; ".join(f"{pid} {named.get(pid, '(inside the root)')}" for pid in survivors)
            raise SlurmHarnessError(f"processes survived the Slurm harness (killed): {which}")

    def reset(self, timeout: float = 20) -> None:
        """Back to a quiet cluster: no jobs, every node IDLE with no reason."""
        if self.active_jobs():
            self.run("scancel", "--full", "--user=root", check=False)
            self._wait(lambda: not self.active_jobs(), timeout, "jobs to end")
        for node, state in self.node_states().items():
            if any(s in state for s in ("down", "drain", "fail")):
                self.run("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)
        self.wait_idle(timeout)

    # -- queries and actions ----------------------------------------------------------
    def ping(self) -> bool:
        try:
            return "UP" in self.run("scontrol", "ping", check=False, timeout=5).stdout
        except subprocess.TimeoutExpired:
            return False

    def node_states(self) -> dict[str, str]:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False, timeout=5).stdout
        return dict(line.split(None, 1) for line in out.splitlines() if line.strip())

    def wait_idle(self, timeout: float = 20) -> None:
        self._wait(lambda: set(self.node_states().values()) == {"idle"}, timeout, "every node IDLE")

    def active_jobs(self) -> list[str]:
        return self.run("squeue", "-h", "-o", "%A", check=False, timeout=5).stdout.split()

    def token(self, lifespan: int = 3600) -> str:
        """A fresh JWT for root, as slurmrestd expects in X-SLURM-USER-TOKEN."""
        out = self.run("scontrol", "token", "username=root", f"lifespan={lifespan}").stdout.strip()
        return out.split("=", 1)[1]

    def write_token(self, lifespan: int = 3600) -> Path:
        self.token_file.write_text(self.token(lifespan) + "\n")
        self.token_file.chmod(0o600)
        return self.token_file

    def submit(self, *sbatch_args: str, script: Path | None = None, env: dict[str, str] | None = None) -> str:
        """``sbatch --parsable`` (a ``script`` or ``--wrap=…`` in the arguments); returns the job id."""
        job_env = self.env | {"PITCREW_JOB_DIR": str(self.job_dir)} | (env or {})
        if script is not None and self._root is not None and not script.is_relative_to(self.run_dir):
            # A root's sbatch sees only the run directory of this machine's files.
            (self.run_dir / "scripts").mkdir(exist_ok=True)
            script = Path(shutil.copy(script, self.run_dir / "scripts" / script.name))
        argv = ["sbatch", "--parsable", f"--output={self.run_dir / 'log' / 'job-%j.out'}", *sbatch_args]
        argv += [str(script)] if script else []
        proc = subprocess.run(
            self.command(*argv), env=job_env, capture_output=True, text=True, timeout=15, check=False
        )
        if proc.returncode != 0:
            raise SlurmHarnessError(f"sbatch failed: {proc.stderr.strip()}")
        return proc.stdout.strip().split(";")[0]

    def settings(self, backend: str = "scontrol") -> dict[str, object]:
        """Keyword arguments for ``bot.integrations.slurm.SlurmSettings`` against this cluster."""
        rest = {"rest_url": self.rest_url, "rest_token_file": self.token_file}
        clients = {"bin_dir": self.bin_dir} if self.bin_dir is not None else {}
        return {"backend": backend, "slurm_conf": self.conf} | clients | (rest if backend == "rest" else {})

    def pitcrew_settings(self, backend: str = "scontrol", **slurm: object) -> dict[str, object]:
        """Configuration keys that make a pitcrew subprocess drive this cluster (YAML-safe values)."""
        values = self.settings(backend) | slurm
        return {
            "integrations": {"scheduler": "slurm"},
            "slurm": {k: str(v) if isinstance(v, Path) else v for k, v in values.items()},
        }

    def job(self, job_id: str) -> JobSnapshot | None:
        """The job as ``scontrol show job`` reports it now (``None`` once Slurm forgot it)."""
        out = self.run("scontrol", "show", "job", "-o", job_id, check=False, timeout=10).stdout
        lines = [line for line in out.splitlines() if line.startswith(f"JobId={job_id} ")]
        return parse_job_line(lines[0]) if lines else None

    @property
    def keeps_reason_on_resume(self) -> bool:
        """Whether a RESUMEd node keeps its last reason: 24.11 does (its ``resumed`` capture), as
        history of a node in service; 22.05 and 26.05 clear it."""
        return self.version == "24.11"

    def node(self, name: str) -> SlurmNodeState:
        """The node as ``scontrol show node`` reports it now."""
        return parse_node_line(self.run("scontrol", "show", "node", "-o", name, timeout=10).stdout.strip())

    def submit_training(
        self, *, requeue: bool = True, extra: tuple[str, ...] = (), steps: int = 600, ckpt_every: int = 1
    ) -> str:
        """The checkpointing job, holding all 8 GPUs of one node so a requeue must move it; it
        checkpoints every ``ckpt_every`` steps and at once on SIGUSR1."""
        flags = ["--requeue" if requeue else "--no-requeue", "--open-mode=append", "--gres=gpu:h100:8"]
        env = {
            "PITCREW_TRAIN_STEPS": str(steps),
            "PITCREW_CKPT_EVERY": str(ckpt_every),
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        }
        # The script as the cluster sees it: a root's sbatch cannot read the checkout.
        script = self.train_job
        return self.submit("--job-name=ckpt-train", *flags, *extra, script=script, env=env)

    def survivors(self, *, jobs: bool = False) -> list[int]:
        """Live daemons and job processes of this cluster (they name the run directory); ``jobs``:
        only what runs a job (its slurmstepd, and the job's own processes)."""
        marker = str(self.run_dir).encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                comm = (entry / "comm").read_text().strip()
                environ = (entry / "environ").read_bytes()
                blob = (entry / "cmdline").read_bytes() + environ
                zombie = (entry / "stat").read_text().split(") ", 1)[-1].startswith("Z")
            except OSError:
                continue
            job = comm == "slurmstepd" or b"SLURM_JOB_ID=" in environ
            ours = job or (comm in _DAEMONS and not jobs)  # not, say, a pitcrew under test
            if ours and marker in blob and not zombie:
                found.append(int(entry.name))
        return found

    def alive(self) -> bool:
        """Every daemon this object started is still running."""
        return bool(self._procs) and all(p.poll() is None for p in self._procs.values())

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{tail(p, 15)}" for p in sorted((self.run_dir / "log").glob("*.log")))

    @property
    def controller_log(self) -> Path:
        return self.run_dir / "log" / "slurmctld.log"

    def states_set(self, since: int = 0) -> list[tuple[str, str]]:
        """(node, state) for each node state slurmctld logged it set on request, from byte ``since``
        of its log (``controller_log.stat().st_size`` before the requests): what reached Slurm,
        whatever Slurm made of the node since."""
        with self.controller_log.open("rb") as file:
            file.seek(since)
            text = file.read().decode(errors="replace")
        return NODE_UPDATE.findall(text)

    # -- internals ---------------------------------------------------------------------
    def _write_files(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir.chmod(0o755)  # slurmrestd reads slurm.conf after dropping root
        for sub in ("etc", "state", "spool", "log", "pids", "munge", "munge-key", "train"):
            (self.run_dir / sub).mkdir(exist_ok=True)
        (self.run_dir / "munge").chmod(0o755)  # munged insists the socket dir is searchable by all
        (self.run_dir / "munge-key").chmod(0o700)
        key = self.run_dir / "munge-key" / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o600)
        jwt = self.run_dir / "jwt_hs256.key"
        jwt.write_bytes(secrets.token_bytes(32))
        jwt.chmod(0o600)
        for node in self.nodes:
            _fake_gpus(self.run_dir / "dev" / node)
            (self.run_dir / "spool" / node).mkdir(exist_ok=True)
        run = self.run_dir
        # Distinct: chosen together (slurmrestd's too: one of this cluster's daemons must not take it).
        dynamic_ports = 1 if self.nodeset else 0  # SlurmdPort, the dynamic nodes' (``_DYNAMIC``)
        ctld_port, self.rest_port, *node_ports = free_ports(2 + dynamic_ports + len(self.nodes))
        slurmd_ports, node_ports = node_ports[:dynamic_ports], node_ports[dynamic_ports:]
        self._ports = [ctld_port, *slurmd_ports, *node_ports]
        feature = f" Feature={self.nodeset}" if self.nodeset else ""
        node_lines = "\n".join(
            f"NodeName={n} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port}{feature}"
            for n, port in zip(self.nodes, node_ports, strict=True)
        )
        dynamic = (
            ""
            if self.nodeset is None
            else _DYNAMIC.substitute(
                max_nodes=len(self.nodes) + 4,
                slurmd_port=slurmd_ports[0],
                nodeset=self.nodeset,
                slurmd_timeout=self.slurmd_timeout,
            )
        )
        conf = _SLURM_CONF.substitute(
            run=run,
            ctld_port=ctld_port,
            dynamic_nodes=dynamic,
            return_to_service=self.return_to_service,
            node_lines=node_lines,
            node_list=self.nodeset or ",".join(self.nodes),
        )
        self.conf.write_text(conf)
        (run / "etc" / "gres.conf").write_text(
            "\n".join(["AutoDetect=off", *map(self._gres, self.nodes), ""])
        )
        if self.version != DEFAULT_VERSION:
            # a newer slurmd wants a cgroup filesystem a chroot lacks; linuxproc tracks the jobs.
            (run / "etc" / "cgroup.conf").write_text("CgroupPlugin=disabled\n")
        shutil.copy(TRAIN_JOB, run / TRAIN_JOB.name)

    def _gres(self, node: str) -> str:
        """``node``'s line of gres.conf: its 8 fake GPUs."""
        return f"NodeName={node} Name=gpu Type=h100 File={self.run_dir}/dev/{node}/nvidia[0-7]"

    def _spawn(
        self, name: str, argv: list[str], env: dict[str, str] | None = None, *, check: bool = True
    ) -> None:
        out = (self.run_dir / "log" / f"{name}.out").open("ab")
        with out:
            proc = subprocess.Popen(
                self.command(*argv),
                env=env or self.env,
                stdout=out,
                stderr=out,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C goes to the demo, which stops jobs, then daemons
            )
        self._procs[name] = proc
        (self.run_dir / "pids" / f"{name}.pid").write_text(f"{proc.pid}\n")
        time.sleep(0.05)
        if check and proc.poll() is not None:
            raise SlurmHarnessError(f"{name} exited at once ({proc.returncode}):\n{self.logs()}")

    def _terminate(self, name: str, grace: float = 10) -> None:
        proc = self._procs.pop(name, None)
        pidfile = self.run_dir / "pids" / f"{name}.pid"
        if proc is not None:
            stop_process(proc, timeout=grace)
        elif pidfile.exists():  # started by another process (python -m proving_ground.slurm)
            pid = int(pidfile.read_text())
            if str(self.run_dir).encode() in _proc_blob(pid):
                _kill(pid, signal.SIGTERM)
                deadline = time.monotonic() + grace
                while _proc_blob(pid) and time.monotonic() < deadline:
                    time.sleep(0.1)
                _kill(pid, signal.SIGKILL)
        pidfile.unlink(missing_ok=True)

    def _rest_answers(self) -> bool:
        """slurmrestd answers on its port, or the one we started has exited. A connection alone
        proves nothing: a server that took the port first (another cluster's slurmd reads a
        length and hangs up) would pass for it, and pitcrew then finds slurmrestd "unreachable".
        Only slurmrestd answers a request without a token 401 "Authentication failure"."""
        if self._procs["slurmrestd"].poll() is not None:
            return True
        request = urllib.request.Request(f"{self.rest_url}/openapi/v3")
        try:
            with urllib.request.urlopen(request, timeout=2):
                return False
        except urllib.error.HTTPError as exc:
            return exc.code == 401 and exc.read().startswith(b"Authentication failure")
        except OSError:
            return False

    def _wait(self, predicate: Callable[[], bool], timeout: float, what: str, *, fail: bool = True) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.1)
        if fail:
            raise SlurmHarnessError(f"timed out after {timeout:.0f}s waiting for {what}\n{self.logs()}")


def missing_binaries() -> dict[str, str]:
    """Slurm and munge programs not installed, each with the Debian package that has it."""
    return {binary: package for binary, package in BINARIES.items() if find_binary(binary) is None}


def _fake_gpus(directory: Path) -> None:
    # Character devices like /dev/nvidiaN (major 195); plain files work but spam slurmd's log.
    directory.mkdir(parents=True, exist_ok=True)
    for index in range(8):
        path = directory / f"nvidia{index}"
        if path.exists():
            continue
        try:
            os.mknod(path, 0o600 | 0o020000, os.makedev(195, index))
        except OSError:
            path.touch()


def _named(pid: int) -> str:
    """A process's command line and its parent, as a survivor report names it."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        parent = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[-1].split()[1]
    except OSError:
        return "(gone)"
    return f"{cmdline.strip()[:200]!r} (parent {parent})"


def _proc_blob(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes() + Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""


def _kill(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def main() -> None:
    """``python -m proving_ground.slurm [RUN_DIR]``: one cluster until Ctrl-C or SIGTERM."""
    cluster = SlurmCluster(
        Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="pitcrew-slurm-"))
    )  # the version from $PROVING_GROUND_SLURM (22.05 unset)
    # Before the cluster is announced, and its start inside the ``try``: a SIGTERM at any point
    # stops the daemons started so far (one just after the announcement killed this process and
    # left them running).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        cluster.start()
        print(
            f"SLURM_CONF={cluster.conf} rest={cluster.rest_url} token_file={cluster.token_file}", flush=True
        )
        while cluster.alive():  # also ends when someone else stops the cluster by its pidfiles
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
