"""Configuration: one YAML file, ``PITCREW_`` environment overrides, secrets from files.

Precedence, highest first: command-line flags, environment (``PITCREW_SERVER__LISTEN``;
``__`` separates nesting levels), the YAML file, defaults. Everything is validated at start
and by ``pitcrew check-config``; an error names the key and says what is wrong. Secrets are
never values in the file: the file names a secret *file* (a mounted Kubernetes Secret),
read once at start.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    YamlConfigSettingsSource,
)

from bot.config_sections import (
    JOB_ACTIONS,
    AuthSettings,
    BasicAuth,
    CapacitySettings,
    CatalogSettings,
    EngineSettings,
    GoodputSettings,
    GrafanaSettings,
    IntegrationSettings,
    KubernetesSettings,
    LogSettings,
    PoolSettings,
    ResumptionSettings,
    ServerSettings,
    Settings,
    SlackSettings,
    SlurmSettings,
    StoreSettings,
    default_state_dir,
)
from bot.domain.catalog import Catalog, Override, parse_catalog
from bot.domain.labels import LabelRules
from bot.domain.playbooks import PlaybookOverride, PlaybookSet, Vocabulary
from bot.domain.policy import Mode, Policy

__all__ = [
    "JOB_RESTART_POLICIES",
    "AuthSettings",
    "BasicAuth",
    "CapacitySettings",
    "CatalogSettings",
    "Config",
    "ConfigError",
    "EngineSettings",
    "GoodputSettings",
    "GrafanaSettings",
    "IntegrationSettings",
    "KubernetesSettings",
    "LogSettings",
    "PoolSettings",
    "ResumptionSettings",
    "ServerSettings",
    "Settings",
    "SlackSettings",
    "SlurmSettings",
    "StoreSettings",
    "default_state_dir",
    "load_catalog",
    "load_config",
    "load_playbooks",
    "load_settings",
    "read_job_template",
    "read_secret",
]


class ConfigError(Exception):
    """Invalid configuration; the message is meant for the operator, one problem per line."""


@dataclass(frozen=True)
class Config:
    """Validated settings plus everything derived from them at start."""

    settings: Settings
    catalog: Catalog
    playbooks: PlaybookSet
    source: Path | None

    @property
    def policy(self) -> Policy:
        """The safety policy: the settings are one (its fields are top-level keys)."""
        return self.settings

    @property
    def labels(self) -> LabelRules:
        return self.settings.labels


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


def load_config(path: Path | None = None, *, steps: Vocabulary | None = None, **overrides: Any) -> Config:
    """The validated configuration; with ``steps`` (the engine's step registry) playbooks are
    also checked against the step vocabulary."""
    settings = load_settings(path, **overrides)
    catalog = load_catalog(settings.catalog.path, settings.catalog.overrides)
    playbooks = load_playbooks(settings.playbooks)
    problems = _cross_check(settings, catalog, playbooks)
    if steps is not None:
        problems += playbooks.problems(steps)
    if problems:
        raise ConfigError("\n".join(problems))
    return Config(settings, catalog, playbooks, path)


def load_catalog(path: Path | None = None, overrides: dict[str, Override] | None = None) -> Catalog:
    where = str(path) if path else "shipped catalog"
    try:
        catalog = parse_catalog(_parse(path.read_text())) if path else _shipped_catalog()
        return catalog.with_overrides(overrides or {})
    except OSError as exc:
        raise ConfigError(f"catalog: cannot read {where}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"catalog: {where} is not valid YAML: {exc}") from None
    except ValidationError as exc:
        raise ConfigError(_explain(exc, path, prefix="catalog")) from None
    except ValueError as exc:
        raise ConfigError(f"catalog: {exc}") from None


@functools.cache
def _shipped_catalog() -> Catalog:
    """The catalog in the package, read once: every ``load_config`` starts from it (a frozen model;
    ``with_overrides`` copies what it changes)."""
    return parse_catalog(_parse(resources.files("bot.data").joinpath("catalog.yaml").read_text()))


def load_playbooks(overrides: dict[str, PlaybookOverride] | None = None) -> PlaybookSet:
    text = resources.files("bot.data").joinpath("playbooks.yaml").read_text()
    try:
        shipped = PlaybookSet.model_validate(_parse(text))
    except ValidationError as exc:  # a packaging defect, but say it clearly
        raise ConfigError(_explain(exc, None, prefix="shipped playbooks")) from None
    problems = []
    for name, override in sorted((overrides or {}).items()):
        try:
            override.over(shipped.playbooks.get(name))
        except ValidationError as exc:  # the shipped playbook with these changes is not valid
            problems.append(_explain(exc, None, prefix=f"playbooks.{name}"))
        except ValueError as exc:
            problems.append(f"playbooks.{name}: {exc}")
    if problems:
        raise ConfigError("\n".join(problems))
    return shipped.changed(overrides or {})


def _parse(text: str) -> Any:
    """YAML as ``yaml.safe_load`` reads it, with libyaml's parser where PyYAML has it: the catalog
    and playbooks are parsed on every start and every CLI call, the shipped catalog in 25 ms
    instead of 170."""
    if yaml.__with_libyaml__:
        return yaml.load(text, Loader=yaml.CSafeLoader)
    return yaml.safe_load(text)


def read_secret(path: Path, what: str) -> str:
    """A secret file's content without surrounding whitespace; never echoes the content."""
    try:
        value = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {path}: {exc.strerror}") from None
    if not value:
        raise ConfigError(f"{what}: {path} is empty")
    return value


#: The ``restartPolicy`` a Job's pod may have (the API server's Job validation): pitcrew writes the
#: first where a template sets none.
JOB_RESTART_POLICIES = ("Never", "OnFailure")


def read_job_template(path: Path, key: str) -> dict[str, Any]:
    """The Job template at ``path`` (the setting ``key``), parsed; else ``ConfigError`` naming the key,
    the file and the first thing wrong. A template is a Job (``kind`` and ``apiVersion``, where
    given, ``Job`` and ``batch/v1``: pitcrew writes them where not) with a container in its pod
    (``spec.template.spec.containers``) and a ``restartPolicy`` a Job takes (``JOB_RESTART_POLICIES``;
    ``Never`` beside a ``podFailurePolicy``), as the API server's Job validation refuses anything
    else (``Required value``: a pod template's default ``Always`` is never a Job's); and no
    ``ttlSecondsAfterFinished``, which is pitcrew's (``kubernetes.jobs.keep_finished``). Read when the
    configuration loads (``_job_template_problems``): one that cannot work fails ``check-config``
    and ``serve``, not the first incident that needs it, in the middle of its repair."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{key}: {path}: cannot read it: {exc.strerror}") from None
    try:
        job = _parse(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{key}: {path} is not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(job, dict):
        found = "is empty" if job is None else f"is not a mapping but a {type(job).__name__}"
        raise ConfigError(f"{key}: {path} {found}: a Job template is a Job (spec.template.spec)")
    for field, wanted in (("kind", "Job"), ("apiVersion", "batch/v1")):
        if job.get(field, wanted) != wanted:
            raise ConfigError(f"{key}: {path} has {field} {job[field]}, not {wanted}")
    found_spec = job.get("spec")
    spec: dict[str, Any] = found_spec if isinstance(found_spec, dict) else {}
    if "ttlSecondsAfterFinished" in spec:
        raise ConfigError(
            f"{key}: {path} sets spec.ttlSecondsAfterFinished, which is pitcrew's: set "
            "kubernetes.jobs.keep_finished (a Job deleted before its verdict is read would run again)"
        )
    template = spec.get("template")
    pod = template.get("spec") if isinstance(template, dict) else None
    if not isinstance(pod, dict) or not isinstance(pod.get("containers"), list) or not pod["containers"]:
        raise ConfigError(f"{key}: {path} has no container in spec.template.spec.containers")
    policy = pod.get("restartPolicy") or JOB_RESTART_POLICIES[0]
    if policy not in JOB_RESTART_POLICIES:
        raise ConfigError(
            f"{key}: {path} has spec.template.spec.restartPolicy {policy}: a Job's pod takes "
            f"{' or '.join(JOB_RESTART_POLICIES)} (unset: {JOB_RESTART_POLICIES[0]})"
        )
    if spec.get("podFailurePolicy") is not None and policy != JOB_RESTART_POLICIES[0]:
        raise ConfigError(
            f"{key}: {path} has spec.template.spec.restartPolicy {policy} beside a podFailurePolicy, "
            f"which takes only {JOB_RESTART_POLICIES[0]}"
        )
    return job


def _job_template_problems(settings: Settings) -> list[str]:
    """``read_job_template``'s refusal of each configured Job template, where a Kubernetes cluster
    runs them (``integrations.cluster: kubernetes``; nothing reads them otherwise)."""
    if settings.integrations.cluster != "kubernetes":
        return []
    problems = []
    for action in JOB_ACTIONS:
        path: Path | None = getattr(settings.kubernetes.jobs, f"{action}_template")
        if path is not None:
            try:
                read_job_template(path, f"kubernetes.jobs.{action}_template")
            except ConfigError as exc:
                problems.append(str(exc))
    return problems


def _cross_check(settings: Settings, catalog: Catalog, playbooks: PlaybookSet) -> list[str]:
    problems = []
    used = (
        catalog.playbooks_used()
        | set(catalog.bucket_playbooks.values())
        | set(catalog.decode_playbooks.values())
    )
    for name in sorted(used):
        if name not in playbooks.playbooks:
            problems.append(f"catalog: playbook {name!r} is used but not defined")
    for name in settings.playbook_modes:
        if name not in playbooks.playbooks:
            problems.append(f"playbook_modes: no playbook named {name!r}")
    for name in settings.escalation.ladder:
        if name not in playbooks.playbooks:
            problems.append(f"escalation.ladder: no playbook named {name!r}")
    if settings.lemon.playbook not in playbooks.playbooks:
        problems.append(f"lemon.playbook: no playbook named {settings.lemon.playbook!r}")
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
    if auth.allow_unauthenticated_reads and not settings.server.loopback_only:
        problems.append(
            f"server.auth.allow_unauthenticated_reads: only on a loopback server.listen, not "
            f"{settings.server.listen}: incidents name nodes, jobs and users; set server.auth.read_token_file"
        )
    for field, secret in (
        ("server.auth.bearer_token_file", auth.bearer_token_file),
        ("server.auth.admin_token_file", auth.admin_token_file),
        ("server.auth.read_token_file", auth.read_token_file),
        ("server.auth.basic_auth.password_file", auth.basic_auth.password_file if auth.basic_auth else None),
    ):
        if secret is not None:
            try:
                read_secret(secret, field)
            except ConfigError as exc:
                problems.append(str(exc))
    problems += _shared_secrets(settings)
    if (
        Mode.APPROVE in {settings.mode, *settings.playbook_modes.values()}
        and not settings.approvals.approvers
    ):
        problems.append("approvals.approvers: mode approve needs at least one approver")
    problems += _slack_problems(settings)
    problems += _job_template_problems(settings)
    return problems


def _slack_problems(settings: Settings) -> list[str]:
    """``integrations.notifier: slack`` needs a token, a channel and the secret of its transport."""
    if settings.integrations.notifier != "slack":
        return []
    slack = settings.slack
    problems = []
    if slack.bot_token_file is None:
        problems.append("slack.bot_token_file: integrations.notifier slack needs the bot token (xoxb-...)")
    if not slack.channel:
        problems.append("slack.channel: integrations.notifier slack needs the channel id (C...)")
    secret = slack.signing_secret_file if slack.transport == "http" else slack.app_token_file
    for field, path in (
        ("slack.bot_token_file", slack.bot_token_file),
        ("slack.signing_secret_file" if slack.transport == "http" else "slack.app_token_file", secret),
    ):
        if path is not None:
            try:
                read_secret(path, field)
            except ConfigError as exc:
                problems.append(str(exc))
    return problems


#: The roles that authenticate someone, each with what its holder may do. A secret serving two
#: roles gives each holder both powers: a webhook sender could pause pitcrew, a reader could
#: forge Slack clicks. Order: the message names the later key and the earlier role.
_ROLES = (
    ("the webhook's token", "send alerts"),
    ("the webhook's basic-auth password", "send alerts"),
    ("the read token", "read every incident"),
    ("the admin token", "approve, roll back and pause"),
    ("Slack's signing secret", "forge Slack clicks and /pitcrew commands"),
)


def _shared_secrets(settings: Settings) -> list[str]:
    """Every pair of roles whose secret is one and the same (one file, or two files holding it)."""
    auth = settings.server.auth
    paths = (
        ("server.auth.bearer_token_file", auth.bearer_token_file),
        ("server.auth.basic_auth.password_file", auth.basic_auth.password_file if auth.basic_auth else None),
        ("server.auth.read_token_file", auth.read_token_file),
        ("server.auth.admin_token_file", auth.admin_token_file),
        ("slack.signing_secret_file", settings.slack.signing_secret_file),
    )
    present = [(key, path, role) for (key, path), role in zip(paths, _ROLES, strict=True) if path is not None]
    problems = []
    for index, (key, path, (role, power)) in enumerate(present):
        for earlier_key, earlier_path, (earlier_role, earlier_power) in present[:index]:
            if _same_secret(path, earlier_path):
                problems.append(
                    f"{key}: {role} is {earlier_role} ({earlier_key}); whoever holds it could "
                    f"{earlier_power} and {power}: give each role its own secret"
                )
    return problems


def _same_secret(one: Path, other: Path) -> bool:
    """The same file, or two files holding the same token (an empty file is reported on its own)."""
    try:
        if one.resolve() == other.resolve():
            return True
        value = one.read_text().strip()
        return bool(value) and value == other.read_text().strip()
    except OSError:
        return False  # unreadable files are reported on their own


def _explain(exc: ValidationError, path: Path | None, prefix: str = "") -> str:
    lines = []
    for error in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in error["loc"])
        key = f"{prefix}.{loc}" if prefix and loc else prefix or loc or "config"
        where = f"{path}: " if path else ""
        message = error["msg"]
        if error["type"] == "value_error":  # our own validators' text, without pydantic's "Value error, "
            message = str(error.get("ctx", {}).get("error", message))
        elif error["type"] == "extra_forbidden":
            message = "unknown key (check the spelling; see the configuration reference in the README)"
        lines.append(f"{where}{key}: {message}")
    return "\n".join(lines)
