"""The fault catalog: what each XID and health fault means and which playbook it gets.

The data lives in ``bot/data/catalog.yaml`` (versioned, built from NVIDIA's Xid catalog for
Ampere and newer). This module only validates its shape and answers lookups; loading the
file is the caller's business. Operators override entries through the configuration
(``catalog.overrides``), applied by ``Catalog.with_overrides``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from bot.domain.nvlink5 import DecodeRow

#: The shipped playbooks, in order of how much they do to a node (``SEVERITY``).
PlaybookName = Literal[
    "ignore",
    "notify-only",
    "ask-human",
    "requeue-hung-job",
    "cordon-and-ask",
    "follow-slurm",
    "isolate-node",
    "checkpoint-reset-gpu",
    "reset-gpu",
    "reboot-node",
    "reboot-then-replace",
    "replace-node",
]
FaultClass = Literal[
    "application",
    "memory",
    "gpu-lost",
    "gpu-hang",
    "interconnect",
    "network",
    "scheduler",
    "job",
    "power-thermal",
    "driver",
    "recovery-action",
    "telemetry",
    "health",
    "informational",
]

#: Playbooks in order of how much they do to a node; the most severe fault on a node wins. The
#: order of ``PlaybookName`` itself, so the two can never differ.
SEVERITY: tuple[str, ...] = get_args(PlaybookName)

#: Playbooks that never change a node.
HANDS_OFF = frozenset({"ignore", "notify-only", "ask-human"})

#: The playbook that does literally what an NVIDIA immediate-action bucket asks, where one does:
#: ``pitcrew catalog`` names every XID whose shipped default is another, and why.
NVIDIA_ACTION: Mapping[str, str] = {
    "IGNORE": "ignore",
    "RESTART_APP": "notify-only",
    "RESET_GPU": "reset-gpu",
    "RESTART_BM": "reboot-node",
    "RESTART_VM": "reboot-node",
}
#: Shipped playbooks that do a bucket's action first and climb the repair ladder only when it does
#: not clear the fault: they do what NVIDIA asks, so ``differs`` says nothing of them.
FIRST_RUNG: Mapping[str, str] = {"reboot-then-replace": "reboot-node"}
#: Why pitcrew's default for a bucket is not NVIDIA's action (an XID's own ``note`` says more);
#: ``{REBOOT_FIRST}`` is the catalog override that selects ``reboot-then-replace`` for the XID.
WHY_NOT_NVIDIA: Mapping[str, str] = {
    "RESTART_BM": "the node goes out for repair at once, as the flow pitcrew follows does: a GPU that "
    "fell off the bus often does again after a reboot, and a cloud node's replacement is cheap; to "
    "reboot first, set the one override {REBOOT_FIRST}: it reboots, and climbs to replace-node inside "
    "the incident if the reboot or the validation fails or the fault comes back within 30m of the "
    "node's return",
    "RESTART_VM": "on bare metal the VM is the node, so it is treated like RESTART_BM; to reboot first, "
    "set the one override {REBOOT_FIRST}",
}


def reboot_first(code: int) -> str:
    """The one setting that makes an XID reboot first and replace only if that does not clear it."""
    return f'catalog: {{overrides: {{"{code}": {{playbook: reboot-then-replace}}}}}}'


def severity(playbook: str) -> int:
    """Rank of a playbook; unknown names (user-defined) rank like ``ask-human``."""
    try:
        return SEVERITY.index(playbook)
    except ValueError:
        return SEVERITY.index("ask-human")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class XidEntry(_Strict):
    mnemonic: str
    meaning: str
    bucket: str
    investigatory: str | None = None
    fault_class: FaultClass = Field(alias="class")
    job_fatal: bool
    playbook: str | None = None
    verified: bool = True
    note: str | None = None


class FaultEntry(_Strict):
    meaning: str
    fault_class: FaultClass = Field(alias="class")
    job_fatal: bool
    playbook: str
    note: str | None = None


class Override(_Strict):
    """Operator's change to one entry (any field may be left out)."""

    playbook: str | None = None
    job_fatal: bool | None = None
    fault_class: FaultClass | None = Field(default=None, alias="class")
    note: str | None = None


class Catalog(_Strict):
    version: str
    source: str
    bucket_playbooks: dict[str, str]
    xids: dict[int, XidEntry]
    faults: dict[str, FaultEntry]
    #: NVIDIA's "Xid 144-150 Decode" rows (``bot.domain.nvlink5``); empty: 144-150 keep their entry.
    xid_decode: tuple[DecodeRow, ...] = ()
    #: The playbook for each bucket a decode row gives (pitcrew policy, like ``bucket_playbooks``).
    decode_playbooks: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> Catalog:
        problems = [
            f"xid {code}: bucket {entry.bucket!r} has no entry in bucket_playbooks"
            for code, entry in self.xids.items()
            if entry.playbook is None and entry.bucket not in self.bucket_playbooks
        ]
        buckets = {row.bucket for row in self.xid_decode}
        buckets |= {row.action2.bucket for row in self.xid_decode if row.action2 is not None}
        problems += [
            f"xid_decode: bucket {bucket!r} has no entry in decode_playbooks"
            for bucket in sorted(buckets - set(self.decode_playbooks))
        ]
        problems += [
            f"xid_decode: row for xid {row.xid} ({row.subcode}) has no xid entry"
            for row in self.xid_decode
            if row.xid not in self.xids
        ]
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def xid(self, code: int) -> XidEntry | None:
        return self.xids.get(code)

    def xid_playbook(self, code: int) -> str | None:
        entry = self.xids.get(code)
        if entry is None:
            return None
        return entry.playbook or self.bucket_playbooks[entry.bucket]

    def differs(self, code: int) -> str | None:
        """Where the XID's shipped playbook is not what NVIDIA's bucket asks: what it asks and why not."""
        entry = self.xids.get(code)
        nvidia = NVIDIA_ACTION.get(entry.bucket) if entry is not None else None
        if entry is None or nvidia is None:
            return None
        playbook = self.xid_playbook(code) or ""
        if FIRST_RUNG.get(playbook, playbook) == nvidia:
            return None
        # The bucket's own policy applies unless the XID names its playbook (its note says why).
        bucket_why = WHY_NOT_NVIDIA.get(entry.bucket) if entry.playbook is None else None
        if bucket_why is not None:
            bucket_why = bucket_why.replace("{REBOOT_FIRST}", reboot_first(code))
        why = bucket_why or entry.note or "pitcrew policy"
        return f"NVIDIA's {entry.bucket} asks for {nvidia}: {why}"

    def playbooks_used(self) -> set[str]:
        used = {self.xid_playbook(code) or "" for code in self.xids}
        used |= {entry.playbook for entry in self.faults.values()}
        return used

    def with_overrides(self, overrides: Mapping[str, Override]) -> Catalog:
        """A copy with operator overrides applied; keys are XID numbers or fault names."""
        xids = dict(self.xids)
        faults = dict(self.faults)
        for key, change in overrides.items():
            patch = change.model_dump(exclude_none=True, by_alias=False)
            if key.isdigit():
                code = int(key)
                if code not in xids:
                    raise ValueError(f"catalog override for unknown xid {code}")
                xids[code] = xids[code].model_copy(update=patch)
            elif key in faults:
                faults[key] = faults[key].model_copy(update=patch)
            else:
                raise ValueError(f"catalog override for unknown fault {key!r}")
        return self.model_copy(update={"xids": xids, "faults": faults})


def parse_catalog(data: Any) -> Catalog:
    """Validate already-loaded YAML data (raises ``pydantic.ValidationError``)."""
    return Catalog.model_validate(data)
