"""Every configuration section as a typed model: pitcrew's public configuration surface.

Field names are configuration keys (``server.listen``) and environment names
(``PITCREW_SERVER__LISTEN``); each field says what it is for. Where the domain already
models a section, the settings use that model as it is: ``Settings`` is a ``Policy`` (the
top-level ``mode``, ``playbook_modes``, ``escalation``, ``guards``, ``approvals``),
``labels`` is a ``LabelRules`` and ``SlurmSettings`` is a ``NodeMapping``. Loading and
cross-checks live in ``bot.config``.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from ipaddress import ip_address
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qsl, urlencode

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from bot.domain import pool_command
from bot.domain.catalog import Override
from bot.domain.durations import Duration
from bot.domain.labels import LabelRules
from bot.domain.nodemap import MappingMode, NodeMapping
from bot.domain.playbooks import PlaybookOverride
from bot.domain.policy import Policy


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "pitcrew"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BasicAuth(_Section):
    username: str
    password_file: Path


class AuthSettings(_Section):
    bearer_token_file: Path | None = Field(
        default=None,
        description="File holding the bearer token Alertmanager sends (http_config.authorization).",
    )
    basic_auth: BasicAuth | None = Field(
        default=None, description="Alternative: basic auth, password from a file."
    )
    admin_token_file: Path | None = Field(
        default=None,
        description="Bearer token for the command API (approve, rollback, pause…); unset = disabled.",
    )
    allow_unauthenticated: bool = Field(
        default=False,
        description="Accept unauthenticated webhooks on a non-loopback address (not recommended).",
    )
    read_token_file: Path | None = Field(
        default=None,
        description="Bearer token for the read API (GET /api/v1/incidents…), which names nodes, jobs "
        "and users; the admin token reads too. Neither set: reads are off.",
    )
    allow_unauthenticated_reads: bool = Field(
        default=False,
        description="Serve the read API without credentials; refused unless server.listen is loopback.",
    )


class ServerSettings(_Section):
    listen: str = Field(default="127.0.0.1:9095", description="HOST:PORT for the webhook, API and /metrics.")
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024, description="Larger bodies get 413.")
    max_connections: int = Field(
        default=512,
        ge=8,
        description="Most open client connections (lowered to what the open-files limit leaves); at the "
        "cap a new connection closes the longest-idle one, unauthenticated first.",
    )
    unauthenticated_idle: Duration = Field(
        default=timedelta(seconds=5),
        description="A connection that has sent no valid credential is closed after this long idle.",
    )
    shutdown_delay: Duration = Field(
        default=timedelta(0),
        description="After SIGTERM, go on serving this long (/readyz answers 503 stopping) before shutting "
        "down: kube-proxy, ingress controllers and load balancers send to a terminating pod for a few "
        "seconds more, and Slack never retries a click or a slash command refused meanwhile. The "
        "manifests set 5s; SIGINT, or a second signal, stops at once.",
    )
    auth: AuthSettings = AuthSettings()

    @field_validator("listen")
    @classmethod
    def _host_port(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"expected HOST:PORT, got {value!r}")
        return value

    @property
    def host(self) -> str:
        return self.listen.rpartition(":")[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.listen.rpartition(":")[2])

    @property
    def loopback_only(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ip_address(self.host).is_loopback
        except ValueError:
            return False


class LeaseSettings(_Section):
    """One actor per store: the lease a process must hold to run playbooks (``bot.store.lease``)."""

    ttl: Duration = Field(
        default=timedelta(seconds=15),
        description="How long the lease lasts unless renewed: a standby takes over this long after "
        "the leader died (at once after a graceful shutdown, which releases it).",
    )
    renew_every: Duration | None = Field(
        default=None,
        description="How often the leader renews, and a standby looks; default ttl/3, at most ttl/2. "
        "A leader that could not renew for ttl - renew_every stops acting before its lease can lapse.",
    )

    @model_validator(mode="after")
    def _renewal_fits(self) -> LeaseSettings:
        if self.ttl < timedelta(seconds=1):
            raise ValueError("store.lease.ttl must be at least 1s")
        if self.renew_every is not None and not timedelta(0) < self.renew_every * 2 <= self.ttl:
            raise ValueError(
                f"store.lease.renew_every must be more than 0 and at most ttl/2 ({self.ttl / 2})"
            )
        return self

    @property
    def renew_interval(self) -> timedelta:
        return self.renew_every if self.renew_every is not None else self.ttl / 3


#: libpq's connection keywords that are secrets: in a URL (``user:password@``, or as any keyword may
#: be given, a query parameter) they would sit in a ConfigMap, an environment variable, a pod spec.
_URL_SECRETS = frozenset({"password", "sslpassword"})


class StoreSettings(_Section):
    url: str | None = Field(
        default=None,
        description="postgresql://user@host:5432/db selects the Postgres store (several replicas, one "
        "leader); unset: the embedded SQLite file at `path`. No password in the URL: see password_file.",
    )
    password_file: Path | None = Field(
        default=None,
        description="File holding the Postgres password (first line), e.g. a mounted Secret; read "
        "again for each new connection (a rotated password is used without a restart).",
    )
    path: Path = Field(default_factory=lambda: default_state_dir() / "pitcrew.db", description="SQLite file.")
    allow_network_filesystem: bool = Field(
        default=False,
        description="Open the SQLite file on a network or cluster filesystem (NFS, CIFS, CephFS, Lustre, "
        "GPFS…), refused otherwise: SQLite's locks hold only on one host, so a pitcrew on another host "
        "would not be fenced. Set only if nothing on another host ever opens the file.",
    )
    synchronous: Literal["normal", "full"] = Field(
        default="full",
        description="full: every acknowledged alert survives power loss; normal: process crashes.",
    )
    lease: LeaseSettings = LeaseSettings()
    retention: Duration | None = Field(
        default=timedelta(days=180),
        description="Closed incidents older than this are pruned with their alerts, steps, approvals and "
        "delivered notices (the audit log is kept whole); unset (null): keep everything.",
    )
    prune_every: Duration = Field(
        default=timedelta(hours=1),
        description="How often the leader prunes what is older than `retention`, in small batches.",
    )

    @model_validator(mode="after")
    def _retention(self) -> StoreSettings:
        if self.retention is not None and self.retention < timedelta(days=1):
            raise ValueError("store.retention must be at least 1d (or null to keep everything)")
        if self.prune_every < timedelta(seconds=1):
            raise ValueError("store.prune_every must be at least 1s")
        return self

    @model_validator(mode="after")
    def _postgres_url(self) -> StoreSettings:
        if self.url is None:
            return self
        scheme, _, rest = self.url.partition("://")
        if scheme not in {"postgresql", "postgres"} or not rest:
            raise ValueError("store.url must be a postgresql:// URL (unset for the embedded SQLite store)")
        userinfo = rest.split("/", 1)[0].rpartition("@")[0]
        query = rest.partition("?")[2]
        if ":" in userinfo or any(key in _URL_SECRETS for key, _ in parse_qsl(query, keep_blank_values=True)):
            raise ValueError("store.url must not carry a password: put it in store.password_file")
        return self


class CatalogSettings(_Section):
    path: Path | None = Field(default=None, description="Replacement catalog file; default: the shipped one.")
    overrides: dict[str, Override] = Field(
        default_factory=dict, description='e.g. {"79": {playbook: reboot-node}}'
    )


class EngineSettings(_Section):
    workers: int = Field(default=8, ge=1, le=256, description="Incidents worked on at once (one per node).")
    retry_backoff: Duration = Field(default=timedelta(seconds=1), description="First retry delay; doubles.")
    retry_backoff_max: Duration = Field(default=timedelta(seconds=30))
    poll_interval: Duration = Field(default=timedelta(seconds=2), description="Polling for wait-type steps.")
    watch_max: Duration = Field(
        default=timedelta(hours=24),
        description="Hands-off and observe-mode incidents stay open while their alerts fire, at most this long.",
    )
    slurm_watch: bool = Field(
        default=False,
        description="Also open incidents for Slurm nodes that Slurm or a health check set DOWN, DRAIN or "
        "FAIL with a reason not pitcrew's (read every poll_interval; Kubernetes node = Slurm node name).",
    )
    hung_job_after: Duration | None = Field(
        default=None,
        description="A RUNNING Slurm job whose resumption.progress_query value stands still this long gets "
        "one notice (fault job-hung; nothing is done to a node; the playbook requeue-hung-job, opted into, "
        "requeues the job alone). Unset: not watched. Needs the progress query and resumption.prometheus_url.",
    )


class IntegrationSettings(_Section):
    """Which system stands behind each port. The dry-run journal changes nothing: only observe mode
    may use it for a port that a mutating step needs (``bot.safety`` refuses anything else)."""

    scheduler: Literal["journal", "slurm"] = Field(
        default="journal",
        description="`slurm` drives Slurm; `journal` writes what would have been done to the journal.",
    )
    cluster: Literal["journal", "none", "kubernetes"] = Field(
        default="journal",
        description="`kubernetes` acts on the cluster (settings under `kubernetes`); `journal` writes what "
        "would have been done; `none` for Slurm-only sites: no Kubernetes, so cordon and drain find "
        "nothing to do and replace, reboot and GPU reset go to a human.",
    )
    notifier: Literal["log", "slack"] = Field(
        default="log",
        description="`log`: every notice is a structured log record (and a journal line) and a timeline "
        "event; `slack`: the same, and delivered to Slack through the durable outbox (see `slack:`).",
    )
    journal_path: Path | None = Field(
        default=None,
        description="Dry-run journal (JSON lines, fsynced): what pitcrew would have done and every notice; "
        "default dry-run-journal.jsonl next to the store.",
    )


class SlurmSettings(NodeMapping):
    """How pitcrew reaches Slurm and maps Kubernetes nodes to Slurm nodes (config key ``slurm``).

    The mapping keys (``node_mapping``, ``node_mapping_key``, ``slinky_pod_selector``) are the
    fields ``NodeMapping`` declares under those aliases; only the aliases are keys here.
    """

    model_config = ConfigDict(validate_by_name=False)

    backend: Literal["scontrol", "rest"] = Field(
        "scontrol",
        description="`scontrol`: Slurm's commands, any version. `rest`: slurmrestd for reads, and for "
        "node updates where the server offers them (v0.0.39+), else scontrol.",
    )
    bin_dir: Path | None = Field(
        None, description="Directory holding scontrol and squeue; unset means search PATH."
    )
    slurm_conf: Path | None = Field(
        None, description="slurm.conf for the commands (exported as SLURM_CONF); unset means Slurm's default."
    )
    command_timeout: float = Field(
        20.0,
        gt=0,
        description="Seconds before a Slurm command is killed. Slurm itself needs ~10 s to give up on "
        "an unreachable controller, so keep this above that to see its message.",
    )
    rest_url: str = Field("http://127.0.0.1:6820", description="slurmrestd base URL.")
    rest_user: str = Field("root", description="Slurm user sent as X-SLURM-USER-NAME.")
    rest_token_file: Path | None = Field(
        None,
        description="File holding the JWT (`scontrol token` output or the bare token). Re-read when it "
        "changes; never logged.",
    )
    rest_api_version: str = Field(
        "auto",
        pattern=r"^(auto|v0\.0\.\d+)$",
        description="`auto` picks the highest slurm/v0.0.XX the server's OpenAPI document offers among those "
        "pitcrew knows (v0.0.38 to v0.0.45); or pin one of those.",
    )
    request_timeout: float = Field(10.0, gt=0, description="Seconds per slurmrestd request.")
    slinky_namespace: str = Field("slurm", description="Namespace of the Slinky NodeSet (slurmd) pods.")

    @model_validator(mode="after")
    def _check(self) -> SlurmSettings:
        if self.backend == "rest" and self.rest_token_file is None:
            raise ValueError("backend rest needs rest_token_file (the slurmrestd JWT)")
        return self

    def mapping(self) -> NodeMapping:
        """The pure mapping rule (``bot.domain.nodemap``) these settings carry: themselves."""
        return self

    @property
    def node_mapping(self) -> MappingMode:
        """The mapping mode under its configuration key's name (``mapping().mode``)."""
        return self.mode


class SlackSettings(_Section):
    """Slack: one thread per incident, Approve / Reject / Rollback buttons, the ``/pitcrew`` command."""

    bot_token_file: Path | None = Field(
        default=None, description="File holding the bot token (xoxb-...); required with notifier slack."
    )
    transport: Literal["http", "socket"] = Field(
        default="socket",
        description="How buttons and /pitcrew reach pitcrew: `socket` (Socket Mode, app-level token, no "
        "inbound exposure) or `http` (POST /slack/events on pitcrew's server, signed with the signing secret).",
    )
    signing_secret_file: Path | None = Field(
        default=None, description="File holding the app's signing secret (transport http)."
    )
    app_token_file: Path | None = Field(
        default=None,
        description="File holding the app-level token (xapp-..., connections:write; transport socket).",
    )
    channel: str = Field(default="", description="Channel id (C...) incident threads and digests go to.")
    approvers: list[str] = Field(
        default_factory=list,
        description="Slack user ids (U...) allowed to approve, reject and roll back from Slack.",
    )
    approver_group: str | None = Field(
        default=None,
        description="A user group id (S...) whose members may approve too (usergroups.users.list, cached).",
    )
    group_cache: Duration = Field(
        default=timedelta(minutes=5), description="How long the group's members are cached."
    )
    second_approver_nodes: int | None = Field(
        default=None,
        ge=1,
        description="Ask a second, different approver when approving would put more than this many nodes "
        "under remediation at once; unset: one approver is enough.",
    )
    second_approver_fraction: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="The same as a share of the fleet (0.05 = 5 %); either threshold asks for a second approver.",
    )
    runbook_url: str | None = Field(
        default=None,
        description="Runbook base URL the parent links (#xid-<n> or #<fault kind>) when the alert carries "
        "no runbook_url annotation of its own; neither: no runbook link.",
    )
    digest_window: Duration = Field(
        default=timedelta(minutes=2),
        description="Incidents opening within this window of each other form a storm...",
    )
    digest_threshold: int = Field(
        default=5,
        ge=2,
        description="...once this many have opened in it: later ones join one digest message, updated as "
        "nodes join, instead of a thread each (Slack allows about one message per second per channel).",
    )
    base_url: str | None = Field(
        default=None,
        description="Slack Web API base URL; unset: https://slack.com/api/ (tests point it elsewhere).",
    )
    retry_backoff_max: Duration = Field(
        default=timedelta(seconds=60),
        description="Longest wait between deliveries of a notice Slack refused for now.",
    )
    socket_give_up: Duration = Field(
        default=timedelta(seconds=30),
        ge=timedelta(seconds=5),
        description="Socket Mode: how long a connection may stay down (a URL that does not connect, a link "
        "that stopped answering pings) before pitcrew closes it and opens a fresh URL.",
    )

    @model_validator(mode="after")
    def _check(self) -> SlackSettings:
        if self.transport == "http" and self.bot_token_file is not None and self.signing_secret_file is None:
            raise ValueError("transport http needs signing_secret_file")
        if self.transport == "socket" and self.bot_token_file is not None and self.app_token_file is None:
            raise ValueError("transport socket needs app_token_file (the app-level xapp- token)")
        return self


class ResumptionSettings(_Section):
    progress_query: str | None = Field(
        default=None,
        description='PromQL giving a job\'s training progress; "{job_id}" is replaced, e.g. '
        'max(train_step{slurm_job_id="{job_id}"}). Unset: RUNNING elsewhere with restarts+1 is the proof.',
    )
    require_progress: bool = Field(default=True, description="With a query, require progress past pre-fault.")
    checkpoint_query: str | None = Field(
        default=None,
        description='PromQL giving a job\'s last checkpoint; "{job_id}" is replaced. The checkpoint step '
        "signals the job and waits for this value to move; unset: that step asks nothing.",
    )
    prometheus_url: str | None = Field(default=None, description="Prometheus base URL for progress queries.")


class GoodputSettings(_Section):
    gpus_per_node: int = Field(
        default=8,
        ge=1,
        description="GPUs of a node whose Slurm node lists no gpu Gres (the GPU-hours lost figure).",
    )
    progress_unit_seconds: float | None = Field(
        default=None,
        gt=0,
        description="Training seconds one unit of resumption.progress_query stands for (1 for a step "
        "a second); unset: progress redone after a restart is not counted as time lost.",
    )
    max_hours_per_incident: float = Field(
        default=24.0,
        gt=0,
        description="The most out-of-service time one incident adds to the GPU-hours counters, per "
        "node and per job; longer is reported in the summary but not counted beyond it.",
    )


class PoolSettings(_Section):
    """One place a stalled gang job may take a node from (``bot.domain.capacity``)."""

    name: str = Field(description="The pool's name (timeline, metrics, `pitcrew plan`).")
    kind: Literal["spare", "lender"] = Field(
        default="spare", description="spare: warm spares kept idle; lender: nodes lent for a while."
    )
    reservation: str | None = Field(
        default=None,
        description="Slurm-only sites: the Slurm reservation holding the pool's nodes apart from the jobs' "
        "partition: a take removes the node from it, the give-back adds the repaired node (or the lent "
        "one) again.",
    )
    selector: str | None = Field(
        default=None,
        description="Kubernetes sites: the label selector of the pool's nodes (`pitcrew.dev/pool=spare`, an "
        "inference node selector). A take removes the selector's labels from the node and sets "
        "`join_labels`; the give-back restores exactly what the take changed.",
    )
    join_labels: dict[str, str] = Field(
        default_factory=dict,
        description="Labels that make the Slinky NodeSet of the jobs' partition select a taken node.",
    )
    join_command: list[str] = Field(
        default_factory=list,
        description="Instead of join_labels: the command that joins a taken node to the jobs' partition "
        "(executable and arguments, run without a shell; placeholders {node}, {incident}, {pool}); "
        "its output goes to the timeline. It may run twice after a crash: make it idempotent.",
    )
    leave_command: list[str] = Field(
        default_factory=list,
        description="With join_command: its undo, run before the lent node goes back to the pool "
        "(give_back: return, a rollback); same placeholders.",
    )
    command_timeout: Duration = Field(
        default=timedelta(minutes=2), description="join_command and leave_command are killed after this."
    )
    leave_labels: list[str] = Field(
        default_factory=list,
        description="Further label keys removed from a taken node while it is lent (an inference "
        "workload's node selector), restored on give-back.",
    )
    evict_grace: Duration = Field(
        default=timedelta(minutes=10),
        description="How long a take from a lender waits for its pods to leave through the Eviction API "
        "(their disruption budgets honoured); past it the node is handed back and the job waits.",
    )
    min_idle: int = Field(default=0, ge=0, description="Idle members the pool keeps after a take.")
    max_lend: float | None = Field(
        default=None,
        gt=0,
        description="Nodes lent at most: a count (>= 1) or a fraction of the pool (< 1); unset: no cap.",
    )

    @model_validator(mode="after")
    def _whole_count(self) -> PoolSettings:
        if self.max_lend is not None and self.max_lend >= 1 and self.max_lend != int(self.max_lend):
            raise ValueError("max_lend is a whole count (>= 1) or a fraction (< 1)")
        if (self.reservation is None) == (self.selector is None):
            raise ValueError(f"pool {self.name}: give a Slurm reservation or a Kubernetes selector, not both")
        if self.selector is not None and bool(self.join_labels) == bool(self.join_command):
            raise ValueError(
                f"pool {self.name}: a Kubernetes pool needs join_labels (what its NodeSet selects) or "
                "join_command (what joins the node otherwise), one of them"
            )
        if bool(self.join_command) != bool(self.leave_command):
            raise ValueError(
                f"pool {self.name}: join_command and leave_command go together (one undoes the other)"
            )
        if self.join_command and self.reservation is not None:
            raise ValueError(f"pool {self.name}: join_command is for a Kubernetes pool (selector)")
        wrong = pool_command.problems([*self.join_command, *self.leave_command])
        if wrong:
            raise ValueError(f"pool {self.name}: " + "; ".join(wrong))
        return self

    def selector_labels(self) -> dict[str, str]:
        """The selector's ``key=value`` terms: the labels a take removes from the node (so it is no
        longer a member) and the give-back restores."""
        terms = [t.strip() for t in (self.selector or "").split(",") if t.strip()]
        return dict(t.split("=", 1) for t in terms if "=" in t and "!=" not in t)


class CapacitySettings(_Section):
    """Where the ``capacity`` step takes a node for a job that cannot restart without one."""

    pools: list[PoolSettings] = Field(
        default_factory=list, description="Tried in order: spare pools first, then lenders."
    )
    give_back: Literal["refill", "return"] = Field(
        default="refill",
        description="refill: the repaired node joins the pool that lent, the lent node stays with the "
        "job; return: the lent node goes back once no job runs on it (within return_wait).",
    )
    return_wait: Duration = Field(
        default=timedelta(minutes=10),
        description="give_back: return: how long the repaired node waits, still out, for the jobs to leave "
        "the lent node; past it the repaired node refills the pool instead (the pool whole, the job "
        "undisturbed). Keep it under give_back's timeout (30m).",
    )
    read_every: Duration = Field(
        default=timedelta(minutes=1),
        description="How often the engine reads the pools' idle members (read only), for the idle "
        "gauges and the spare GPU-hours held idle; a take reads them too.",
    )

    @model_validator(mode="after")
    def _unique(self) -> CapacitySettings:
        names = [p.name for p in self.pools]
        if len(set(names)) != len(names):
            raise ValueError("capacity.pools: every pool has its own name")
        return self


#: How much of the graphs around an incident its dashboard link shows, before the fault and after the close.
_AROUND = timedelta(minutes=30)


class GrafanaSettings(_Section):
    url: str | None = Field(
        default=None,
        description="Grafana base URL: notices link the incidents dashboard, and with token_file "
        "incidents are annotated; unset = neither.",
    )
    api_url: str | None = Field(
        default=None,
        description="Where pitcrew calls Grafana's API (annotations, check-config --live) when it is not "
        "where people open it, e.g. the in-cluster Service while url is the public address; unset = url.",
    )
    token_file: Path | None = Field(
        default=None,
        description="File holding a Grafana service-account token (Annotations: write); unset = links only.",
    )
    timeout: Duration = Field(default=timedelta(seconds=10), description="Per-request timeout.")
    incidents_dashboard_uid: str = Field(
        default="pitcrew-incidents", description="Dashboard linked from notices and annotated."
    )
    fleet_dashboard_uid: str = Field(
        default="pitcrew-gpu-fleet-health", description="GPU fleet health dashboard linked from notices."
    )
    retry_backoff_max: Duration = Field(
        default=timedelta(seconds=60),
        description="Longest wait between deliveries of an annotation Grafana refused for now "
        "(down, 5xx, 429); annotations wait in the outbox, remediation never does.",
    )

    @model_validator(mode="after")
    def _url_with_token(self) -> GrafanaSettings:
        if self.token_file is not None and self.api is None:
            raise ValueError("grafana.token_file needs grafana.url or grafana.api_url (where to annotate)")
        return self

    @property
    def api(self) -> str | None:
        """The one rule for where pitcrew calls Grafana: ``api_url``, else ``url``."""
        return self.api_url if self.api_url is not None else self.url

    def incident_dashboard(self, start: datetime, end: datetime | None) -> str | None:
        """The one rule for an incident's Grafana link: the incidents dashboard over the incident's
        time (its region annotation in view), from before the fault to after the close (or now)."""
        if self.url is None:
            return None
        window = {
            "from": int((start - _AROUND).timestamp() * 1000),
            "to": int((end + _AROUND).timestamp() * 1000) if end is not None else "now",
        }
        return f"{self.url.rstrip('/')}/d/{self.incidents_dashboard_uid}?{urlencode(window)}"


ReplaceStrategy = Literal["cluster-api", "karpenter", "delete-node", "command", "none"]


class KubernetesReplaceSettings(_Section):
    """How a broken node is replaced (the ``replace`` step; a playbook's ``strategy`` option overrides)."""

    strategy: ReplaceStrategy = Field(
        default="none",
        description="`cluster-api`: delete the node's Machine (its MachineSet makes a new one); `karpenter`: "
        "delete its NodeClaim; `delete-node`: run `command` (the provider action that terminates the "
        "instance, so its instance group launches a new one), then delete the Node object: deleting a Node "
        "alone stops no instance and replaces nothing; `command`: run `command`; `none`: hand the "
        "replacement to humans.",
    )
    command: list[str] = Field(
        default_factory=list,
        description="`command` strategy, and `delete-node`'s provider action: executable and arguments; "
        "PITCREW_NODE, PITCREW_INCIDENT and PITCREW_ACTION are in its environment; exit code 0 means the "
        "replacement started.",
    )
    command_timeout: Duration = Field(
        default=timedelta(minutes=5), description="Kill the command after this."
    )
    pool_labels: list[str] = Field(
        default_factory=lambda: ["node.cluster.x-k8s.io/pool", "karpenter.sh/nodepool"],
        description="Node labels naming the node's pool; a replacement is a new fleet node with the same "
        "values for those of them the replaced node had.",
    )

    @model_validator(mode="after")
    def _command_given(self) -> KubernetesReplaceSettings:
        if self.strategy == "command" and not self.command:
            raise ValueError("strategy command needs command: the executable (and arguments) to run")
        if self.strategy == "delete-node" and not self.command:
            raise ValueError(
                "strategy delete-node needs command: the provider action that terminates the instance "
                "(deleting the Node object alone leaves the machine running and nothing replaces it)"
            )
        return self


#: What a Job template may be configured for: ``kubernetes.jobs.<action>_template``.
JOB_ACTIONS = ("reset_gpu", "reboot", "validation")
#: The shortest ``kubernetes.jobs.keep_finished``: a Job deleted before pitcrew read its verdict
#: would be made again by the step's retry, and its action run twice.
KEEP_FINISHED_AT_LEAST = timedelta(hours=1)


class KubernetesJobSettings(_Section):
    """Privileged Jobs pinned to the node: GPU reset, reboot and the optional validation before return."""

    namespace: str = Field(
        default="pitcrew-jobs",
        description="Namespace the Jobs run in: its Pod Security level must admit their privileged pods "
        "(deploy/kubernetes/namespace.yaml labels it `privileged`; pitcrew's own namespace is `restricted`).",
    )
    reset_gpu_template: Path | None = Field(
        default=None,
        description="YAML Job template for `reset_gpu`; pitcrew sets its name, `nodeName`, a toleration "
        "of its taint and PITCREW_NODE/PITCREW_GPUS/PITCREW_INCIDENT env. Unset: `reset_gpu_command`. "
        "Each template is read when the configuration loads: a Job with a container and a `restartPolicy` "
        "of Never (written where unset) or OnFailure, or the configuration is refused.",
    )
    reboot_template: Path | None = Field(default=None, description="YAML Job template for `reboot`.")
    validation_template: Path | None = Field(
        default=None,
        description="YAML Job template run on the repaired node before it returns (e.g. a DCGM diagnostic); "
        "a failure escalates to replacement. Unset: no validation.",
    )
    reset_gpu_command: list[str] = Field(
        default_factory=list, description="Instead of a Job: an executable run for `reset_gpu` (exit 0 = ok)."
    )
    reboot_command: list[str] = Field(
        default_factory=list, description="Instead of a Job: an executable run for `reboot` (exit 0 = ok)."
    )
    timeout: Duration = Field(
        default=timedelta(minutes=10),
        description="Job or command deadline; the reset Job's `activeDeadlineSeconds` where its template sets "
        "none, so the Job controller stops a reset that hangs on a GPU gone bad instead of leaving it on the node "
        "(a reboot's and a validation's run as long as they take: a slow boot, a long diagnostic).",
    )
    keep_finished: Duration = Field(
        default=timedelta(days=7),
        description="How long a finished Job stays, its pod and logs with it, for a post-mortem: Kubernetes "
        "deletes it then (`ttlSecondsAfterFinished`, pitcrew's to set: a template may not). At least 1h, so "
        "pitcrew has read its verdict first.",
    )

    @model_validator(mode="after")
    def _keep_finished(self) -> KubernetesJobSettings:
        if self.keep_finished < KEEP_FINISHED_AT_LEAST:
            raise ValueError("kubernetes.jobs.keep_finished must be at least 1h")
        return self


class ClusterApiSettings(_Section):
    """Where the Cluster API Machines are: the management cluster, usually not the workload cluster."""

    kubeconfig: Path | None = Field(
        default=None,
        description="kubeconfig of the management cluster holding the Machines (strategy `cluster-api`); "
        "unset with `context` unset: the workload cluster's own connection (a self-hosted cluster).",
    )
    context: str | None = Field(
        default=None,
        description="Context of the management cluster in `kubeconfig` (or in the workload kubeconfig when "
        "`kubeconfig` is unset); unset: that file's current-context.",
    )
    namespace: str | None = Field(
        default=None,
        description="Namespace of the Machines; unset: the node's `cluster.x-k8s.io/cluster-namespace` annotation.",
    )

    @property
    def separate(self) -> bool:
        """Machines are reached through a connection of their own."""
        return self.kubeconfig is not None or self.context is not None


class KubernetesSettings(_Section):
    """How pitcrew reaches the Kubernetes API and what it may do there (``integrations.cluster: kubernetes``)."""

    in_cluster: bool = Field(
        default=False, description="Use the pod's service account (pitcrew runs in the cluster)."
    )
    kubeconfig: Path | None = Field(
        default=None, description="kubeconfig file when not in-cluster; unset: $KUBECONFIG or ~/.kube/config."
    )
    context: str | None = Field(default=None, description="kubeconfig context; unset: its current-context.")
    request_timeout: float = Field(default=10.0, gt=0, description="Seconds per API request.")
    retries: int = Field(
        default=3, ge=0, le=10, description="The client's own retries of idempotent requests on 5xx."
    )
    qps: float = Field(
        default=20.0, gt=0, description="Requests per second to the API server, shared by every step."
    )
    burst: int = Field(default=40, ge=1, description="Requests allowed at once above `qps` (token bucket).")
    node_selector: str = Field(
        default="nvidia.com/gpu.present=true",
        description="Label selector of the GPU fleet (the breaker's fleet size and replacement candidates).",
    )
    gpu_resource: str = Field(default="nvidia.com/gpu", description="Extended resource counting GPUs.")
    never_drain_namespaces: list[str] = Field(
        default_factory=lambda: ["kube-system", "gpu-operator"],
        description="Pods in these namespaces are never evicted (and never block a replacement).",
    )
    force_delete_not_ready: bool = Field(
        default=False,
        description="Allow force-deleting pods (grace 0) of a NotReady node when a playbook asks for it "
        "(drain option force_delete_on_dead_node); off: such pods are only evicted.",
    )
    replace: KubernetesReplaceSettings = KubernetesReplaceSettings()
    jobs: KubernetesJobSettings = KubernetesJobSettings()
    cluster_api: ClusterApiSettings = ClusterApiSettings()


class LogSettings(_Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    format: Literal["json", "text"] = "json"


class Settings(BaseSettings, Policy):
    """Everything an operator can set. Keys and env names are pitcrew's public interface.

    The safety policy's fields are top-level keys: they are inherited from ``Policy``.
    """

    model_config = SettingsConfigDict(
        env_prefix="PITCREW_",
        env_nested_delimiter="__",
        extra="forbid",
        nested_model_default_partial_update=True,
    )

    server: ServerSettings = ServerSettings()
    store: StoreSettings = StoreSettings()
    labels: LabelRules = LabelRules()
    catalog: CatalogSettings = CatalogSettings()
    playbooks: dict[str, PlaybookOverride] = Field(
        default_factory=dict,
        description="Additions (whole) and changes to shipped playbooks (fields left out keep the shipped values).",
    )
    engine: EngineSettings = EngineSettings()
    integrations: IntegrationSettings = IntegrationSettings()
    slurm: SlurmSettings = SlurmSettings()
    resumption: ResumptionSettings = ResumptionSettings()
    goodput: GoodputSettings = GoodputSettings()
    capacity: CapacitySettings = CapacitySettings()
    grafana: GrafanaSettings = GrafanaSettings()
    slack: SlackSettings = SlackSettings()
    kubernetes: KubernetesSettings = KubernetesSettings()
    log: LogSettings = LogSettings()
