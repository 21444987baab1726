"""Alertmanager webhook payload (version 4) as frozen models.

Accepts every shape Alertmanager really sends: firing and resolved alerts mixed in one
delivery, resolved alerts never seen firing, re-sent groups, ``truncatedAlerts`` and
unknown extra fields (ignored). Rejects what is not a webhook with a reason a human can
act on. Deduplication keys live here too: ``(fingerprint, startsAt)`` identifies one
occurrence of one alert; ``groupKey`` is only used for threading.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError, field_validator

#: Alertmanager writes this for "not ended yet".
_ZERO_TIME = datetime(1, 1, 1, tzinfo=UTC)

#: Alertmanager's ``truncatedAlerts`` is a uint64; a larger count is not Alertmanager's.
MAX_TRUNCATED = 2**64 - 1

LabelName = Annotated[str, Field(max_length=256)]
LabelValue = Annotated[str, Field(max_length=4096)]


class Alert(BaseModel):
    """One alert of a webhook delivery."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    status: Literal["firing", "resolved"]
    labels: dict[LabelName, LabelValue]
    annotations: dict[LabelName, LabelValue] = Field(default_factory=dict)
    starts_at: AwareDatetime = Field(alias="startsAt")
    ends_at: AwareDatetime | None = Field(default=None, alias="endsAt")
    generator_url: str = Field(default="", alias="generatorURL", max_length=8192)
    fingerprint: str = Field(min_length=1, max_length=64)

    @field_validator("ends_at")
    @classmethod
    def _not_ended(cls, value: datetime | None) -> datetime | None:
        return None if value is None or value <= _ZERO_TIME else value

    @property
    def firing(self) -> bool:
        return self.status == "firing"

    @property
    def key(self) -> tuple[str, str]:
        """Identity of this occurrence: the same labels firing again later get a new key."""
        return (self.fingerprint, self.starts_at.isoformat())

    @property
    def alertname(self) -> str:
        return self.labels.get("alertname", "")


class WebhookPayload(BaseModel):
    """The body Alertmanager POSTs to a webhook receiver."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    version: str
    receiver: str = Field(default="", max_length=1024)
    status: Literal["firing", "resolved"]
    alerts: list[Alert]
    group_labels: dict[LabelName, LabelValue] = Field(default_factory=dict, alias="groupLabels")
    common_labels: dict[LabelName, LabelValue] = Field(default_factory=dict, alias="commonLabels")
    common_annotations: dict[LabelName, LabelValue] = Field(default_factory=dict, alias="commonAnnotations")
    external_url: str = Field(default="", alias="externalURL", max_length=8192)
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


def parse_webhook(body: bytes) -> WebhookPayload:
    """Parse and validate one delivery, or raise ``PayloadError`` with a short reason."""
    try:
        return WebhookPayload.model_validate_json(body)
    except ValidationError as exc:
        raise PayloadError(_summarise(exc)) from None


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
