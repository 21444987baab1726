"""From one alert to one fault: what broke, where, and which playbook it calls for.

Several alerts often describe one fault (the last-XID gauge, the windowed count and the
total counter all fire for one XID 79 on GPU 3); they collapse onto one ``Fault.key``.
Anything the catalog does not know becomes ``ask-human``: pitcrew never guesses an action.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from bot.domain.catalog import Catalog, severity
from bot.domain.labels import Subject
from bot.domain.nvlink5 import NVLINK5_XIDS, Decoded, decode

#: ``fault`` label values that mean "this is an XID alert" rather than a catalog fault.
XID_FAULT_LABELS = frozenset({"xid", "xid-window", "xid-total", "xid-gauge"})
RECOVERY_XID = 154

# XID 154 messages name the new recovery action, e.g. "... to 0x1 (GPU Reset Required)".
_RECOVERY_ACTIONS: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (re.compile(r"reboot|restart bare|system reboot", re.I), "reboot-node", "node reboot required"),
    (re.compile(r"reset", re.I), "reset-gpu", "GPU reset required"),
    (re.compile(r"drain\s*p2p", re.I), "cordon-and-ask", "drain P2P required"),
    (re.compile(r"\bnone\b|no action", re.I), "ignore", "no recovery action needed"),
)
#: Numeric ``DCGM_FI_DEV_GPU_RECOVERY_ACTION`` values (NVML ``nvmlDeviceGpuRecoveryAction_t``).
_RECOVERY_CODES = {
    "0": ("ignore", "no recovery action needed"),
    "1": ("reset-gpu", "GPU reset required"),
    "2": ("reboot-node", "node reboot required"),
    "3": ("cordon-and-ask", "drain P2P required"),
    "4": ("reset-gpu", "drain P2P and GPU reset required"),
}


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault on one node (and GPU, where known)."""

    kind: str
    node: str
    gpu: str | None
    xid: int | None
    bucket: str | None
    fault_class: str
    playbook: str
    job_fatal: bool
    meaning: str
    known: bool
    detail: str = ""
    #: The network port of a link fault: ``mlx5_0 port 1`` (InfiniBand/RoCE) or ``ens1f0`` (Ethernet).
    link: str | None = None

    @property
    def key(self) -> str:
        """Stable identity within a node: alerts describing the same thing share it."""
        what = f"xid{self.xid}" if self.xid is not None else self.kind
        if self.link:
            return f"{what}@{self.link.replace(' port ', '/')}"
        return f"{what}@gpu{self.gpu}" if self.gpu else what

    @property
    def short(self) -> str:
        """A few words for Slurm reasons and titles: ``XID 79 gpu3``, ``link-down mlx5_0 port 1``."""
        head = f"XID {self.xid}" if self.xid is not None else self.kind
        if self.link:
            return f"{head} {self.link}"
        return f"{head} gpu{self.gpu}" if self.gpu else head

    def describe(self) -> str:
        where = f" on {self.link}" if self.link else f" on GPU {self.gpu}" if self.gpu else ""
        head = f"XID {self.xid}{where}" if self.xid is not None else f"{self.kind}{where}"
        bucket = f", NVIDIA bucket {self.bucket}" if self.bucket else ""
        return f"{head} ({self.meaning}{bucket})"


def classify(subject: Subject, catalog: Catalog) -> Fault | None:
    """The fault an alert describes, or ``None`` when the alert names no node."""
    if subject.node is None:
        return None
    label = subject.fault_label
    if label and label in catalog.faults and subject.xid is None:
        entry = catalog.faults[label]
        # A link fault names its port, and says what the rule counted (downs, errors) in its words.
        link = subject.link if entry.fault_class == "network" else None
        return Fault(
            kind=label,
            node=subject.node,
            gpu=None if link else subject.gpu,
            xid=None,
            bucket=None,
            fault_class=entry.fault_class,
            playbook=entry.playbook,
            job_fatal=entry.job_fatal,
            meaning=entry.meaning,
            known=True,
            # Faults of pitcrew's own watches say what they saw (Slurm's reason, the job's progress).
            detail=subject.message if link or entry.fault_class in {"scheduler", "job"} else "",
            link=link,
        )
    if subject.xid is not None:
        return _xid_fault(subject, subject.xid, catalog)
    detail = (
        f"xid value {subject.xid_text!r} is not an XID (ASCII digits)"
        if subject.xid_text
        else "fault not in the catalog"
    )
    return _for_a_human(subject.node, subject.gpu, label or "unknown", None, "unrecognised fault", detail)


def _for_a_human(node: str, gpu: str | None, kind: str, xid: int | None, meaning: str, detail: str) -> Fault:
    """A fault pitcrew does not know: humans decide, nothing is done to the node."""
    return Fault(
        kind=kind,
        node=node,
        gpu=gpu,
        xid=xid,
        bucket=None,
        fault_class="informational",
        playbook="ask-human",
        job_fatal=False,
        meaning=meaning,
        known=False,
        detail=detail,
    )


def _xid_fault(subject: Subject, xid: int, catalog: Catalog) -> Fault:
    assert subject.node is not None
    entry = catalog.xid(xid)
    if entry is None:
        return _for_a_human(subject.node, subject.gpu, "xid", xid, "XID not in the catalog", subject.message)
    playbook = catalog.xid_playbook(xid) or "ask-human"
    job_fatal = entry.job_fatal
    detail = subject.message
    if xid in NVLINK5_XIDS and catalog.xid_decode:
        decoded = _nvlink5(subject, xid, catalog)
        if isinstance(decoded, Decoded):
            playbook = catalog.decode_playbooks[decoded.bucket]
            job_fatal = decoded.gpu_fatal
            detail = decoded.describe()
        else:
            detail = f"{decoded}; the catalog entry stands" + (
                f": {subject.message}" if subject.message else ""
            )
    elif xid == RECOVERY_XID:
        resolved = _recovery_playbook(subject.message, subject.recovery_action)
        if resolved is None:
            detail = "recovery action not stated in the alert; a human decides"
        else:
            playbook, detail = resolved
    return Fault(
        kind="xid",
        node=subject.node,
        gpu=subject.gpu,
        xid=xid,
        bucket=entry.bucket,
        fault_class=entry.fault_class,
        playbook=playbook,
        job_fatal=job_fatal and playbook not in {"ignore", "notify-only"},
        meaning=entry.meaning,
        known=True,
        detail=detail,
    )


def _nvlink5(subject: Subject, xid: int, catalog: Catalog) -> Decoded | str:
    """XIDs 144-150 decoded from the kernel line's registers, or why not (the entry then stands)."""
    line = subject.xid_line
    if line is None:
        return "no kernel line with the sub-code's registers in the alert"
    if line.xid != xid:
        return f"the kernel line is for XID {line.xid}, not {xid}"
    rank = {bucket: severity(playbook) for bucket, playbook in catalog.decode_playbooks.items()}
    return decode(catalog.xid_decode, line, rank)


def _recovery_playbook(message: str, code: str | None) -> tuple[str, str] | None:
    if code is not None and code.strip() in _RECOVERY_CODES:
        return _RECOVERY_CODES[code.strip()]
    # Only the part after "to" names the new action ("changed from 0x0 (None) to 0x1 (...)").
    tail = re.split(r"\bto\b", message, maxsplit=1, flags=re.I)[-1]
    for pattern, playbook, words in _RECOVERY_ACTIONS:
        if pattern.search(tail):
            return playbook, words
    return None
