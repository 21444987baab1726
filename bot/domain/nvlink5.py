"""XIDs 144-150 (NVLink5) by their sub-code: NVIDIA's "Xid 144-150 Decode" rules, applied.

The XID number alone says only "an NVLink5 unit reported something"; NVIDIA's bucket for all seven
is WORKFLOW_NVLINK5_ERR ("decode the message"). The driver's kernel line carries what to decode::

    NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 (0x021425c6 0x00000000 ...)

``<intrInfo>`` is the first register in the parentheses and ``<errorStatus>`` the second (NVIDIA's
"Resolution Buckets" sheet, WORKFLOW_NVLINK5_ERR). A decode row matches when intrInfo fits the row's
32-bit mask (``-`` is any bit; V1 for drivers before R575, V2 from R575) and errorStatus is one of the
row's values. A row may carry a second mask ("Action 2") under which a promotable error takes a
stronger bucket. The rows themselves are data (``xid_decode`` in ``bot/data/catalog.yaml``).

The V1 and V2 masks never give two different answers for one intrInfo (checked over all 95 rows by
the table test), so the driver version is not needed. An errorStatus with several single-bit flags
set is each of those errors at once: the most severe of their rows decides. Anything else (no
kernel line, a line for another XID, a value no row matches, rows that disagree) is undecided, and
the catalog's entry for the XID stands.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, field_validator

NVLINK5_XIDS = range(144, 151)

_MASK = re.compile(r"[01-]{32}")
_STATUS = re.compile(r"0x[0-9A-Fa-f]{1,8}")
#: ``Xid (PCI:…): 145, RLW_REMAP Fatal XC0 i0 Link 03 (0x… 0x… …)``: the XID, the sub-code words, the
#: first two registers. The sub-code text is informative only; the registers decide.
_LINE = re.compile(
    r"Xid\s*\([^)]*\):\s*(?P<xid>\d{1,4}),\s*(?P<words>[^()]{0,160}?)\s*"
    r"\(\s*(?P<intr>0x[0-9A-Fa-f]{1,8})\s+(?P<status>0x[0-9A-Fa-f]{1,8})\b"
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _mask(value: str) -> str:
    if not _MASK.fullmatch(value):
        raise ValueError(f"{value!r} is not a 32-character mask of 0, 1 and -")
    return value


class SecondAction(_Strict):
    """NVIDIA's "Action 2": the bucket a promotable error takes under these masks."""

    v1: str
    v2: str
    bucket: str

    _masks = field_validator("v1", "v2")(_mask)


class DecodeRow(_Strict):
    """One row of NVIDIA's "Xid 144-150 Decode" sheet, verbatim."""

    xid: int
    subcode: str
    v1: str
    v2: str
    #: One value, alternatives separated by ``/`` (``0x00000000/0xFFFFFFFF``), or empty: the sheet
    #: gives none (NETIR link events), and any errorStatus fits.
    status: str
    bucket: str
    action2: SecondAction | None = None
    investigatory: str
    severity: str

    _masks = field_validator("v1", "v2")(_mask)

    @field_validator("status")
    @classmethod
    def _statuses(cls, value: str) -> str:
        if value and not all(_STATUS.fullmatch(part) for part in value.split("/")):
            raise ValueError(f"{value!r} is not hex values separated by '/'")
        return value

    def fits_status(self, status: int) -> bool:
        return not self.status or status in {int(part, 16) for part in self.status.split("/")}


@dataclass(frozen=True, slots=True)
class KernelLine:
    """The registers an NVLink5 XID line carries."""

    xid: int
    words: str
    intr_info: int
    error_status: int


@dataclass(frozen=True, slots=True)
class Decoded:
    """The rows an NVLink5 XID matched and the bucket they give."""

    bucket: str
    #: NVIDIA's severity for the deciding row (``Fatal``, ``Link Fatal``, ``Non-fatal`` ...), or
    #: ``promoted`` when Action 2 applied.
    severity: str
    subcode: str
    investigatory: str
    line: KernelLine

    @property
    def gpu_fatal(self) -> bool:
        """NVIDIA: a GPU-fatal error takes every link down and ends every application channel; a
        link-fatal one leaves the GPU "drain and reset recommended" until its jobs have drained."""
        return _gpu_fatal(self.severity)

    def describe(self) -> str:
        return (
            f"{self.subcode} intrInfo 0x{self.line.intr_info:08x} errorStatus 0x{self.line.error_status:08x}:"
            f" NVIDIA decode {self.bucket} ({self.severity}; investigate: {self.investigatory})"
        )


def kernel_line(text: str) -> KernelLine | None:
    """The XID and registers in an ``NVRM: Xid`` line, or ``None`` when ``text`` holds none."""
    match = _LINE.search(text)
    if match is None:
        return None
    return KernelLine(
        xid=int(match["xid"]),
        words=" ".join(match["words"].split()),
        intr_info=int(match["intr"], 16),
        error_status=int(match["status"], 16),
    )


def fits(mask: str, value: int) -> bool:
    """Whether the 32-bit ``value`` has every bit the mask fixes (``-`` is any bit)."""
    bits = format(value, "032b")
    return all(m in ("-", b) for m, b in zip(mask, bits, strict=True))


def _matches(rows: Sequence[DecodeRow], intr_info: int, status: int) -> list[tuple[DecodeRow, str, str]]:
    """(row, bucket, severity) for every row the registers fit, through its main or its second masks."""
    found = []
    for row in rows:
        if not row.fits_status(status):
            continue
        if fits(row.v1, intr_info) or fits(row.v2, intr_info):
            found.append((row, row.bucket, row.severity))
        elif row.action2 is not None and (fits(row.action2.v1, intr_info) or fits(row.action2.v2, intr_info)):
            found.append((row, row.action2.bucket, "promoted"))
    return found


def _bits(value: int) -> list[int]:
    return [1 << n for n in range(32) if value >> n & 1]


def decode(rows: Sequence[DecodeRow], line: KernelLine, rank: dict[str, int]) -> Decoded | str:
    """The decode of ``line`` against ``rows``, or why there is none.

    ``rank`` orders the decode buckets by how much they do; several single-bit errors reported in
    one errorStatus are each decoded and the highest-ranked wins. Rows that match one value with two
    different buckets leave the answer undecided.
    """
    mine = [row for row in rows if row.xid == line.xid]
    if not mine:
        return f"no decode rows for XID {line.xid}"
    registers = f"XID {line.xid} intrInfo 0x{line.intr_info:08x} errorStatus 0x{line.error_status:08x}"
    found = _matches(mine, line.intr_info, line.error_status)
    if found and len({bucket for _, bucket, _ in found}) > 1:
        return f"{registers} matches rows that disagree ({', '.join(sorted({b for _, b, _ in found}))})"
    flags = _bits(line.error_status)
    if not found and len(flags) > 1:
        per_flag = [_matches(mine, line.intr_info, flag) for flag in flags]
        if all(per_flag):
            found = [match for matches in per_flag for match in matches]
    if not found:
        return f"{registers} matches no row of NVIDIA's decode sheet"
    unranked = sorted({bucket for _, bucket, _ in found if bucket not in rank})
    if unranked:
        return f"{registers}: decode bucket {', '.join(unranked)} has no playbook"
    row, bucket, severity = max(found, key=lambda m: (rank[m[1]], _gpu_fatal(m[2])))
    subcodes = "/".join(dict.fromkeys(r.subcode for r, b, _ in found if b == bucket))
    return Decoded(
        bucket=bucket, severity=severity, subcode=subcodes, investigatory=row.investigatory, line=line
    )


def _gpu_fatal(severity: str) -> bool:
    return severity.startswith("Fatal") or severity == "promoted"
