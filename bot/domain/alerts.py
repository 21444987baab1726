"""Alertmanager webhook payload (version 4) as frozen models.

Accepts every shape Alertmanager really sends: firing and resolved alerts mixed in one
delivery, resolved alerts never seen firing, re-sent groups, ``truncatedAlerts`` and
unknown extra fields (ignored), annotations and URLs of any length (clipped, with a mark, to
``ANNOTATION_MAX``/``URL_MAX``). Rejects what is not a webhook with a reason a human can
act on (``PayloadError``), and a webhook with an alert pitcrew refuses — a time outside the
window around now that ``check_times`` allows, a node label that is no node name
(``bot.domain.labels``) — naming the alert (``AlertRejected``).
Deduplication keys live here too: ``(fingerprint, startsAt)`` identifies one occurrence of
one alert, with ``startsAt`` in UTC whatever offset the sender wrote; ``groupKey`` is only
used for threading.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Annotated, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
)

from bot.domain.durations import format_duration

#: Alertmanager writes this for "not ended yet".
_ZERO_TIME = datetime(1, 1, 1, tzinfo=UTC)

#: How far ahead of pitcrew's clock an alert may say it started. NTP-synced clocks differ by
#: milliseconds; beyond this the sender's clock is wrong, and a start in the future would make
#: every duration measured from it negative and the alert never "stale" to the breaker guard.
MAX_CLOCK_SKEW = timedelta(minutes=10)
#: How long ago an alert may say it started. Only a guard against broken clocks (epoch 0, year
#: 1): an alert can fire for months, and a delivery refused for one alert is refused whole.
MAX_ALERT_AGE = timedelta(days=3653)
#: Alertmanager's ``truncatedAlerts`` is a uint64; a larger count is not Alertmanager's.
MAX_TRUNCATED = 2**64 - 1

LabelName = Annotated[str, Field(max_length=256)]
#: An alert's (and a delivery's) status as Alertmanager sends it.
AlertStatus = Literal["firing", "resolved"]
LabelValue = Annotated[str, Field(max_length=4096)]
#: Longest annotation value and URL pitcrew keeps. What only describes an alert is clipped to
#: these, never refused: Alertmanager sets no length limit (``alert.Validate`` checks times and
#: label names) and never retries a 4xx (``notify.Retrier``: 5xx only), so a delivery refused
#: for one alert's long templated description would be refused at every ``group_interval`` and
#: its node's real fault never seen. Labels are the alert's identity and keep their limits.
ANNOTATION_MAX, URL_MAX = 4096, 8192
#: A NUL character, which PostgreSQL's text cannot hold: a label, a fingerprint or a group key with
#: one failed its delivery's write there (a 500, sent again and again), where SQLite kept it. Refused
#: on both stores, its place named (``parse_webhook``); what only describes an alert has it replaced.
_NUL = "\x00"


def _clipped(limit: int) -> BeforeValidator:
    def clip(value: object) -> object:
        if not isinstance(value, str):
            return value
        if _NUL in value:  # kept, marked: a description is never worth refusing its alert for
            value = value.replace(_NUL, "\ufffd")
        if len(value) <= limit:
            return value
        # Room for the mark with as many digits as the whole length: the count clipped has no more.
        kept = limit - len(f" [{len(value):,} characters clipped]")
        return f"{value[:kept]} [{len(value) - kept:,} characters clipped]"

    return BeforeValidator(clip)


AnnotationValue = Annotated[str, _clipped(ANNOTATION_MAX)]
Url = Annotated[str, _clipped(URL_MAX)]


class Alert(BaseModel):
    """One alert of a webhook delivery."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    status: AlertStatus
    labels: dict[LabelName, LabelValue]
    annotations: dict[LabelName, AnnotationValue] = Field(default_factory=dict)
    starts_at: AwareDatetime = Field(alias="startsAt")
    ends_at: AwareDatetime | None = Field(default=None, alias="endsAt")
    generator_url: Url = Field(default="", alias="generatorURL")
    fingerprint: str = Field(min_length=1, max_length=64)

    @field_validator("starts_at")
    @classmethod
    def _starts_utc(cls, value: datetime) -> datetime:
        return _utc(value)

    @field_validator("ends_at")
    @classmethod
    def _not_ended(cls, value: datetime | None) -> datetime | None:
        return None if value is None or value <= _ZERO_TIME else _utc(value)

    @property
    def firing(self) -> bool:
        return self.status == "firing"

    @property
    def key(self) -> tuple[str, str]:
        """Identity of this occurrence: the same labels firing again later get a new key."""
        return dedupe_key(self.fingerprint, self.starts_at)

    @property
    def alertname(self) -> str:
        return self.labels.get("alertname", "")


class WebhookPayload(BaseModel):
    """The body Alertmanager POSTs to a webhook receiver."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    version: str
    receiver: str = Field(default="", max_length=1024)
    status: AlertStatus
    alerts: list[Alert]
    group_labels: dict[LabelName, LabelValue] = Field(default_factory=dict, alias="groupLabels")
    common_labels: dict[LabelName, LabelValue] = Field(default_factory=dict, alias="commonLabels")
    common_annotations: dict[LabelName, AnnotationValue] = Field(
        default_factory=dict, alias="commonAnnotations"
    )
    external_url: Url = Field(default="", alias="externalURL")
    group_key: str = Field(default="", alias="groupKey", max_length=8192)
    truncated_alerts: int = Field(default=0, alias="truncatedAlerts", ge=0, le=MAX_TRUNCATED)

    @field_validator("version")
    @classmethod
    def _v4(cls, value: str) -> str:
        if value != "4":
            raise ValueError(f"unsupported webhook version {value!r}; pitcrew speaks version 4")
        return value


class PayloadError(ValueError):
    """A body that is not an Alertmanager v4 webhook; ``str()`` is safe to return to the sender."""


class AlertRejected(PayloadError):
    """A webhook with alerts pitcrew refuses; ``str()`` names each alert and what is wrong with it.

    The whole delivery is refused and nothing of it is stored. With the shipped route
    (``group_by: [node]``, ``node`` required) the alerts of one delivery share their node
    label, so this refuses no other node's alerts; the 400 pages humans
    (``PitcrewWebhookRejecting``) and Alertmanager sends the group again at its next
    ``group_interval``, instead of half a group being acted on.
    """

    @classmethod
    def of(cls, problems: Sequence[tuple[int, Alert, str]], limit: int = 3) -> AlertRejected:
        return cls(_listed([f"{locate(index, alert)}: {why}" for index, alert, why in problems], limit))


def _listed(problems: Sequence[str], limit: int = 3) -> str:
    """The first ``limit`` problems, and how many more: a refusal's words."""
    more = [f"and {len(problems) - limit} more"] if len(problems) > limit else []
    return "; ".join([*problems[:limit], *more])


def dedupe_key(fingerprint: str, starts_at: datetime) -> tuple[str, str]:
    """``(fingerprint, startsAt)`` as stored: startsAt in UTC to the microsecond, so that the same
    instant written ``…Z`` and ``…+01:00`` is one alert."""
    return (fingerprint, starts_at.astimezone(UTC).isoformat(timespec="microseconds"))


def locate(index: int, alert: Alert) -> str:
    """``alerts.2 (GpuXidCritical, fingerprint 54faa5ba6fe53303)``: which alert of a delivery."""
    name = alert.alertname if len(alert.alertname) <= 80 else alert.alertname[:77] + "..."
    return f"alerts.{index} ({name or 'no alertname'}, fingerprint {alert.fingerprint})"


def check_times(payload: WebhookPayload, now: datetime) -> None:
    """Refuse (``AlertRejected``) alerts whose times cannot be true at ``now``."""
    latest, earliest = now + MAX_CLOCK_SKEW, now - MAX_ALERT_AGE
    problems = [
        (index, alert, _time_problem(alert, now))
        for index, alert in enumerate(payload.alerts)
        if not earliest <= alert.starts_at <= latest
        or (alert.status == "resolved" and alert.ends_at is not None and alert.ends_at > latest)
    ]
    if problems:
        raise AlertRejected.of(problems)


def _time_problem(alert: Alert, now: datetime) -> str:
    clock = f"pitcrew's clock reads {now.astimezone(UTC).isoformat()}; check the sender's clock"
    ahead = f"more than {format_duration(MAX_CLOCK_SKEW)} ahead of pitcrew's clock"
    if alert.starts_at > now + MAX_CLOCK_SKEW:
        return f"startsAt {alert.starts_at.isoformat()} is {ahead} ({clock})"
    if alert.starts_at < now - MAX_ALERT_AGE:
        return f"startsAt {alert.starts_at.isoformat()} is more than {MAX_ALERT_AGE.days} days ago ({clock})"
    return f"resolved, but endsAt {alert.ends_at.isoformat() if alert.ends_at else ''} is {ahead} ({clock})"


def _utc(value: datetime) -> datetime:
    """The same instant in UTC, so that one instant written with two offsets is one key."""
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError("outside the years 1 to 9999 in UTC") from None


def parse_webhook(body: bytes) -> WebhookPayload:
    """Parse and validate one delivery, or raise ``PayloadError`` with a short reason."""
    try:
        payload = WebhookPayload.model_validate_json(body)
    except ValidationError as exc:
        raise PayloadError(_summarise(exc)) from None
    if b"\\u0000" in body:  # how JSON writes a NUL: most bodies are not looked at again
        _refuse_nul(payload)
    return payload


def _refuse_nul(payload: WebhookPayload) -> None:
    """Refuse (``PayloadError``) a delivery whose identity holds a NUL (``_NUL``): its labels,
    fingerprints, group key or receiver, each place named. What only describes an alert has it
    replaced instead (``_clipped``)."""
    fields: list[tuple[str, str]] = [("receiver", payload.receiver), ("groupKey", payload.group_key)]
    for name, labels in (("groupLabels", payload.group_labels), ("commonLabels", payload.common_labels)):
        fields += [(f"{name}.{key}", f"{key}{value}") for key, value in labels.items()]
    for index, alert in enumerate(payload.alerts):
        fields.append((f"alerts.{index}.fingerprint", alert.fingerprint))
        fields += [(f"alerts.{index}.labels.{key}", f"{key}{value}") for key, value in alert.labels.items()]
    found = [where.replace(_NUL, "\\u0000") for where, text in fields if _NUL in text]
    if found:
        raise PayloadError(
            _listed(
                [f"{where}: holds a NUL character (\\u0000), which pitcrew does not store" for where in found]
            )
        )


def _summarise(exc: ValidationError, limit: int = 3) -> str:
    """The first few problems, located, without echoing the input back."""
    parts = []
    for error in exc.errors(include_url=False, include_input=False)[:limit]:
        where = ".".join(str(p) for p in error["loc"]) or "body"
        parts.append(f"{where}: {error['msg']}")
    more = exc.error_count() - limit
    if more > 0:
        parts.append(f"and {more} more")
    return "; ".join(parts)
