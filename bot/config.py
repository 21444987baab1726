"""Configuration: one YAML file, ``PITCREW_`` environment overrides, secrets from files.

Precedence, highest first: command-line flags, environment (``PITCREW_SERVER__LISTEN``;
``__`` separates nesting levels), the YAML file, defaults. Everything is validated at start
and by ``pitcrew check-config``; an error names the key and says what is wrong. Secrets are
never values in the file: the file names a secret *file* (a mounted Kubernetes Secret),
read once at start.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from importlib import resources
from ipaddress import ip_address
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from bot.domain.catalog import Catalog, Override, parse_catalog
from bot.domain.durations import Duration
from bot.domain.labels import (
    DEFAULT_GPU_LABELS,
    DEFAULT_NODE_LABELS,
    DEFAULT_XID_ANNOTATIONS,
    DEFAULT_XID_LABELS,
    LabelRules,
)
from bot.domain.nodemap import DEFAULT_SLINKY_SELECTOR, NodeMapping
from bot.domain.playbooks import Playbook, PlaybookSet
from bot.domain.policy import ApprovalPolicy, BreakerPolicy, EscalationPolicy, Mode, NodePolicy, Policy


class ConfigError(Exception):
    """Invalid configuration; the message is meant for the operator, one problem per line."""


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


class ServerSettings(_Section):
    listen: str = Field(default="127.0.0.1:9095", description="HOST:PORT for the webhook, API and /metrics.")
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024, description="Larger bodies get 413.")
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


class StoreSettings(_Section):
    path: Path = Field(default_factory=lambda: default_state_dir() / "pitcrew.db", description="SQLite file.")
    synchronous: Literal["normal", "full"] = Field(
        default="full",
        description="full: every acknowledged alert survives power loss; normal: process crashes.",
    )


class LabelSettings(_Section):
    node: tuple[str, ...] = DEFAULT_NODE_LABELS
    gpu: tuple[str, ...] = DEFAULT_GPU_LABELS
    xid: tuple[str, ...] = DEFAULT_XID_LABELS
    xid_annotations: tuple[str, ...] = DEFAULT_XID_ANNOTATIONS


class CatalogSettings(_Section):
    path: Path | None = Field(default=None, description="Replacement catalog file; default: the shipped one.")
    overrides: dict[str, Override] = Field(
        default_factory=dict, description='e.g. {"79": {playbook: reboot-node}}'
    )


class GuardSettings(_Section):
    breaker: BreakerPolicy = BreakerPolicy()
    node: NodePolicy = NodePolicy()


class EngineSettings(_Section):
    workers: int = Field(default=8, ge=1, le=256, description="Incidents worked on at once (one per node).")
    retry_backoff: Duration = Field(default=timedelta(seconds=1), description="First retry delay; doubles.")
    retry_backoff_max: Duration = Field(default=timedelta(seconds=30))
    poll_interval: Duration = Field(default=timedelta(seconds=2), description="Polling for wait-type steps.")
    watch_max: Duration = Field(
        default=timedelta(hours=24),
        description="Hands-off and observe-mode incidents stay open while their alerts fire, at most this long.",
    )


class IntegrationSettings(_Section):
    scheduler: Literal["recording", "slurm"] = "recording"
    cluster: Literal["recording"] = "recording"
    notifier: Literal["recording"] = "recording"
    recording_path: Path | None = Field(
        default=None,
        description="Journal of what the recording integrations did (JSON lines); default next to the store.",
    )
    recording_latency: Duration = Field(
        default=timedelta(0), description="Round trip added to every recorded far-side call (demos, tests)."
    )
    recording_inventory: Path | None = Field(
        default=None,
        description="YAML inventory (nodes, pods, Slurm jobs) the recording far side starts from.",
    )


class SlurmSettings(BaseModel):
    """How pitcrew reaches Slurm and maps Kubernetes nodes to Slurm nodes (config key ``slurm``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

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
        description="`auto` picks the highest slurm/v0.0.XX in the server's OpenAPI document; or pin one.",
    )
    request_timeout: float = Field(10.0, gt=0, description="Seconds per slurmrestd request.")
    node_mapping: Literal["identity", "label", "annotation", "slinky"] = Field(
        "identity",
        description="How a Kubernetes node names its Slurm node(s): same name, a label, an annotation, "
        "or the Slinky slurmd pods on it (then Slurm is drained through the slurm-operator).",
    )
    node_mapping_key: str | None = Field(
        None, description="Label or annotation key holding the Slurm node name(s) (a hostlist is allowed)."
    )
    slinky_namespace: str = Field("slurm", description="Namespace of the Slinky NodeSet (slurmd) pods.")
    slinky_pod_selector: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_SLINKY_SELECTOR),
        description="Labels that select slurmd pods in Slinky mode.",
    )

    @model_validator(mode="after")
    def _check(self) -> SlurmSettings:
        if self.node_mapping in ("label", "annotation") and not self.node_mapping_key:
            raise ValueError(f"slurm.node_mapping={self.node_mapping} needs slurm.node_mapping_key")
        if self.backend == "rest" and self.rest_token_file is None:
            raise ValueError("slurm.backend=rest needs slurm.rest_token_file")
        return self

    def mapping(self) -> NodeMapping:
        """The pure mapping rule (``bot.domain.nodemap``) these settings describe."""
        return NodeMapping(self.node_mapping, self.node_mapping_key, dict(self.slinky_pod_selector))


class ResumptionSettings(_Section):
    progress_query: str | None = Field(
        default=None,
        description='PromQL giving a job\'s training progress; "{job_id}" is replaced, e.g. '
        'max(train_step{slurm_job_id="{job_id}"}). Unset: RUNNING elsewhere with restarts+1 is the proof.',
    )
    require_progress: bool = Field(default=True, description="With a query, require progress past pre-fault.")
    prometheus_url: str | None = Field(default=None, description="Prometheus base URL for progress queries.")


class LogSettings(_Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    format: Literal["json", "text"] = "json"


class Settings(BaseSettings):
    """Everything an operator can set. Keys and env names are pitcrew's public interface."""

    model_config = SettingsConfigDict(
        env_prefix="PITCREW_",
        env_nested_delimiter="__",
        extra="forbid",
        nested_model_default_partial_update=True,
    )

    mode: Mode = Field(default=Mode.OBSERVE, description="observe | approve | auto")
    playbook_modes: dict[str, Mode] = Field(default_factory=dict)
    server: ServerSettings = ServerSettings()
    store: StoreSettings = StoreSettings()
    labels: LabelSettings = LabelSettings()
    catalog: CatalogSettings = CatalogSettings()
    playbooks: dict[str, Playbook] = Field(default_factory=dict, description="Overrides and additions.")
    escalation: EscalationPolicy = EscalationPolicy()
    guards: GuardSettings = GuardSettings()
    approvals: ApprovalPolicy = ApprovalPolicy()
    engine: EngineSettings = EngineSettings()
    integrations: IntegrationSettings = IntegrationSettings()
    slurm: SlurmSettings = SlurmSettings()
    resumption: ResumptionSettings = ResumptionSettings()
    log: LogSettings = LogSettings()

    @field_validator("mode", mode="before")
    @classmethod
    def _mode_lower(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value


@dataclass(frozen=True)
class Config:
    """Validated settings plus everything derived from them at start."""

    settings: Settings
    catalog: Catalog
    playbooks: PlaybookSet
    policy: Policy
    labels: LabelRules
    source: Path | None


def load_settings(path: Path | None = None, **overrides: Any) -> Settings:
    """Settings from ``path`` (YAML), the environment and ``overrides`` (flags)."""

    class _Sourced(Settings):
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
            if path is not None:
                sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=path))
            return tuple(sources)

    if path is not None and not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        return _Sourced(**overrides)
    except ValidationError as exc:
        raise ConfigError(_explain(exc, path)) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None


def load_config(path: Path | None = None, **overrides: Any) -> Config:
    settings = load_settings(path, **overrides)
    catalog = load_catalog(settings.catalog.path, settings.catalog.overrides)
    playbooks = load_playbooks(settings.playbooks)
    policy = Policy(
        mode=settings.mode,
        playbook_modes=settings.playbook_modes,
        escalation=settings.escalation,
        breaker=settings.guards.breaker,
        node=settings.guards.node,
        approvals=settings.approvals,
    )
    problems = _cross_check(settings, catalog, playbooks)
    if problems:
        raise ConfigError("\n".join(problems))
    labels = LabelRules(
        node=settings.labels.node,
        gpu=settings.labels.gpu,
        xid=settings.labels.xid,
        xid_annotations=settings.labels.xid_annotations,
    )
    return Config(settings, catalog, playbooks, policy, labels, path)


def load_catalog(path: Path | None = None, overrides: dict[str, Override] | None = None) -> Catalog:
    where = str(path) if path else "shipped catalog"
    try:
        text = path.read_text() if path else resources.files("bot.data").joinpath("catalog.yaml").read_text()
        catalog = parse_catalog(yaml.safe_load(text))
        return catalog.with_overrides(overrides or {})
    except OSError as exc:
        raise ConfigError(f"catalog: cannot read {where}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"catalog: {where} is not valid YAML: {exc}") from None
    except ValidationError as exc:
        raise ConfigError(_explain(exc, path, prefix="catalog")) from None
    except ValueError as exc:
        raise ConfigError(f"catalog: {exc}") from None


def load_playbooks(overrides: dict[str, Playbook] | None = None) -> PlaybookSet:
    text = resources.files("bot.data").joinpath("playbooks.yaml").read_text()
    try:
        shipped = PlaybookSet.model_validate(yaml.safe_load(text))
    except ValidationError as exc:  # a packaging defect, but say it clearly
        raise ConfigError(_explain(exc, None, prefix="shipped playbooks")) from None
    return shipped.merged(overrides or {})


def read_secret(path: Path, what: str) -> str:
    """A secret file's content without surrounding whitespace; never echoes the content."""
    try:
        value = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {path}: {exc.strerror}") from None
    if not value:
        raise ConfigError(f"{what}: {path} is empty")
    return value


def _cross_check(settings: Settings, catalog: Catalog, playbooks: PlaybookSet) -> list[str]:
    problems = []
    for name in sorted(catalog.playbooks_used() | set(catalog.bucket_playbooks.values())):
        if name not in playbooks.playbooks:
            problems.append(f"catalog: playbook {name!r} is used but not defined")
    for name in settings.playbook_modes:
        if name not in playbooks.playbooks:
            problems.append(f"playbook_modes: no playbook named {name!r}")
    for name in settings.escalation.ladder:
        if name not in playbooks.playbooks:
            problems.append(f"escalation.ladder: no playbook named {name!r}")
    auth = settings.server.auth
    if auth.bearer_token_file and auth.basic_auth:
        problems.append("server.auth: set bearer_token_file or basic_auth, not both")
    if not (auth.bearer_token_file or auth.basic_auth or auth.allow_unauthenticated) and not (
        settings.server.loopback_only
    ):
        problems.append(
            f"server.auth: listening on {settings.server.listen} without authentication; set "
            "server.auth.bearer_token_file (or allow_unauthenticated: true if something else guards the port)"
        )
    for field, secret in (
        ("server.auth.bearer_token_file", auth.bearer_token_file),
        ("server.auth.admin_token_file", auth.admin_token_file),
        ("server.auth.basic_auth.password_file", auth.basic_auth.password_file if auth.basic_auth else None),
    ):
        if secret is not None:
            try:
                read_secret(secret, field)
            except ConfigError as exc:
                problems.append(str(exc))
    if (
        Mode.APPROVE in {settings.mode, *settings.playbook_modes.values()}
        and not settings.approvals.approvers
    ):
        problems.append("approvals.approvers: mode approve needs at least one approver")
    return problems


def _explain(exc: ValidationError, path: Path | None, prefix: str = "") -> str:
    lines = []
    for error in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in error["loc"])
        key = f"{prefix}.{loc}" if prefix and loc else prefix or loc or "config"
        where = f"{path}: " if path else ""
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            message = "unknown key (check the spelling; see the configuration reference in the README)"
        lines.append(f"{where}{key}: {message}")
    return "\n".join(lines)
