"""XIDs 144-150 by sub-code, table-tested against NVIDIA's "Xid 144-150 Decode" sheet.

Cases: the shipped rows are the sheet's 95 (count per XID, bucket and severity tally and a digest of
their text, taken from ``Xid-Catalog.xlsx`` SHA-256 7f70ce96…); every row, under each of its masks
(V1, V2 and Action 2) and each of its error statuses, walked through a real alert's kernel line
into the shipped classification: fatal → reset-gpu with the job down, link-fatal → reset-gpu with
the job drained, IGNORE and XID_154_EVAL → a notice only; no intrInfo fits two rows that disagree
(so the driver version is not needed); several error flags at once take the worst; anything not
decodable leaves the catalog entry (ask-human) and says why; dcgm-exporter's own ``err_msg`` is no
kernel line.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from datetime import UTC, datetime

import pytest

from bot.config import load_catalog, load_playbooks
from bot.domain.alerts import Alert
from bot.domain.faults import Fault, classify
from bot.domain.labels import subject_of
from bot.domain.nvlink5 import DecodeRow, fits
from bot.domain.planner import plan
from bot.domain.policy import Mode, Policy
from bot.engine.steps import REGISTRY

CATALOG = load_catalog()
ROWS = CATALOG.xid_decode
NOW = datetime(2026, 12, 2, 1, 0, tzinfo=UTC)

# Facts of the sheet, counted by hand from Xid-Catalog.xlsx, written out apart from the data file.
ROWS_PER_XID = {144: 6, 145: 33, 146: 20, 147: 2, 148: 1, 149: 31, 150: 2}
TALLY = {
    ("IGNORE", "Non-fatal"): 40,
    ("RESET_GPU", "Fatal"): 18,
    ("RESET_GPU", "Link Fatal"): 18,
    ("XID_154_EVAL", "Non-fatal"): 8,
    ("RESET_GPU", "Fatal**"): 4,
    ("IGNORE", "Non-fatal*"): 3,
    ("RESET_GPU", "Link Fatal?"): 2,
    ("IGNORE", "Link Fatal"): 1,
    ("IGNORE", "Fatal"): 1,
}
#: sha256 over the rows as ``xid|subcode|v1|v2|status|bucket|v1/v2/bucket of action 2|investigatory|severity``
#: lines, computed from the sheet's cells as read straight from the xlsx (the same digest).
DIGEST = "eb9d8b94e4e0a330a44d5f8b1eeecebd64f97a3b5475c40bfc4808d55f8f5d42"
# The spec: NVIDIA's decode bucket → what pitcrew does, and whether the job goes down with it.
SPEC = {"RESET_GPU": "reset-gpu", "IGNORE": "notify-only", "XID_154_EVAL": "notify-only"}


def canonical(row: DecodeRow) -> str:
    second = f"{row.action2.v1}/{row.action2.v2}/{row.action2.bucket}" if row.action2 else ""
    fields = (
        row.xid,
        row.subcode,
        row.v1,
        row.v2,
        row.status,
        row.bucket,
        second,
        row.investigatory,
        row.severity,
    )
    return "|".join(map(str, fields))


def test_the_rows_are_the_sheets() -> None:
    assert len(ROWS) == 95
    assert Counter(row.xid for row in ROWS) == ROWS_PER_XID
    assert Counter((row.bucket, row.severity) for row in ROWS) == TALLY
    assert sum(1 for row in ROWS if row.action2 is not None) == 3
    text = "\n".join(map(canonical, ROWS))
    assert hashlib.sha256(text.encode()).hexdigest() == DIGEST


def value_for(mask: str, rng: random.Random) -> int:
    """An intrInfo that fits ``mask``: its fixed bits, and random bits where it says any."""
    return int("".join(bit if bit != "-" else rng.choice("01") for bit in mask), 2)


def line(xid: int, words: str, intr: int, status: int) -> str:
    """The driver's line, in the format NVIDIA's sheet gives for WORKFLOW_NVLINK5_ERR."""
    return (
        f"NVRM: Xid (PCI:0009:01:00): {xid}, {words} XC0 i0 Link 03"
        f" (0x{intr:08x} 0x{status:08x} 0x00000000 0x00000000 0x00000000 0x00000000)"
    )


def alert(xid: int, annotation: str, err_msg: str = "NVLINK: RLW Error") -> Alert:
    """The XID alert a kernel-log rule raises: dcgm-style labels, the kernel line in an annotation."""
    return Alert.model_validate(
        {
            "status": "firing",
            "labels": {
                "alertname": "GpuXid",
                "node": "gpu-node-02",
                "gpu": "3",
                "xid": str(xid),
                "err_msg": err_msg,
            },
            "annotations": {"description": annotation},
            "startsAt": "2026-12-02T01:00:00Z",
            "fingerprint": "f",
        }
    )


def fault_of(xid: int, text: str) -> Fault:
    found = classify(subject_of(alert(xid, text)), CATALOG)
    assert found is not None
    return found


def cases() -> list[tuple[str, int, str, int, int, str, bool]]:
    """(id, xid, subcode, intrInfo, errorStatus, playbook, job down) for every row, mask and status."""
    rng = random.Random(25)
    out = []
    for index, row in enumerate(ROWS):
        statuses = [int(s, 16) for s in row.status.split("/")] if row.status else [rng.getrandbits(32)]
        masks = [("v1", row.v1, row.bucket, row.severity), ("v2", row.v2, row.bucket, row.severity)]
        if row.action2 is not None:
            masks += [
                (f"a2{v}", m, row.action2.bucket, "promoted")
                for v, m in (("v1", row.action2.v1), ("v2", row.action2.v2))
            ]
        for version, mask, bucket, severity in masks:
            for status in statuses:
                down = bucket == "RESET_GPU" and (severity.startswith("Fatal") or severity == "promoted")
                case_id = f"row{index + 2}-{row.xid}-{row.subcode}-{version}-{status:#x}"
                out.append((case_id, row.xid, row.subcode, value_for(mask, rng), status, SPEC[bucket], down))
    return out


CASES = cases()


@pytest.mark.parametrize(
    ("xid", "subcode", "intr", "status", "playbook", "down"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_every_decode_row_gets_its_spec_action(
    xid: int, subcode: str, intr: int, status: int, playbook: str, down: bool
) -> None:
    found = fault_of(xid, line(xid, f"{subcode} Fatal", intr, status))
    assert (found.playbook, found.job_fatal) == (playbook, down), found.detail
    assert subcode.split("/")[0] in found.detail
    steps = plan("gpu-node-02", [found], [], Policy(mode=Mode.AUTO), load_playbooks(), NOW, REGISTRY)
    if playbook == "reset-gpu":
        assert "reset_gpu" in steps.steps
        assert steps.slurm_action == ("down" if down else "drain")
    else:
        assert not {"reset_gpu", "slurm_down", "cordon"} & set(steps.steps)


def test_every_row_is_walked() -> None:
    walked = {c[0].split("-")[0] for c in CASES}
    assert len(walked) == 95


def masks(row: DecodeRow) -> list[tuple[str, str]]:
    found = [(row.v1, row.bucket), (row.v2, row.bucket)]
    if row.action2 is not None:
        found += [(row.action2.v1, row.action2.bucket), (row.action2.v2, row.action2.bucket)]
    return found


def compatible(a: str, b: str) -> bool:
    return all(x == "-" or y == "-" or x == y for x, y in zip(a, b, strict=True))


def overlap(a: DecodeRow, b: DecodeRow) -> bool:
    if not a.status or not b.status:
        return True
    return bool(set(a.status.split("/")) & set(b.status.split("/")))


def test_no_intrinfo_fits_two_rows_that_disagree() -> None:
    """V1 (<R575) and V2 (>=R575) masks are both tried: that is sound only if no value fits two rows
    of one XID with different buckets, whichever version wrote it."""
    clashes = [
        (a.subcode, ma, b.subcode, mb)
        for i, a in enumerate(ROWS)
        for b in ROWS[i + 1 :]
        if a.xid == b.xid and overlap(a, b)
        for ma, ba in masks(a)
        for mb, bb in masks(b)
        if ba != bb and compatible(ma, mb)
    ]
    assert clashes == []


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (0x00000012, ("reset-gpu", True)),  # two fatal flags
        (0x00000005, ("notify-only", False)),  # two ignorable flags
        (0x00000003, ("reset-gpu", True)),  # one of each: the worse decides
        (0x40000000, ("ask-human", False)),  # a flag no row names: the entry stands
        (0x00000041, ("ask-human", False)),  # one flag known, one not
    ],
)
def test_several_error_flags_at_once(status: int, expected: tuple[str, bool]) -> None:
    found = fault_of(144, line(144, "SAW_MVB Nonfatal", 0x00000021, status))
    assert (found.playbook, found.job_fatal) == expected, found.detail


def test_a_real_link_fatal_line_drains_and_resets() -> None:
    # NVIDIA's own example shape: NETIR_LINK_EVT, link-down reason 0x21 in bits 25..20 (peer side).
    found = fault_of(
        149,
        "[171167.620236] NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01"
        " (0x021425c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
    )
    assert (found.playbook, found.job_fatal) == ("reset-gpu", False)
    assert "INVESTIGATE_PEER_DEVICE" in found.detail


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "no kernel line"),
        ("NVLINK: RLW Error", "no kernel line"),  # dcgm-exporter's err_msg for 145: a fixed text
        (line(149, "NETIR_LINK_EVT Fatal", 0x021425C6, 0), "for XID 149, not 145"),
        (line(145, "RLW_REMAP Fatal", 0x00000082, 0x00000400), "matches no row"),
        (line(145, "RLW_REMAP Fatal", 0x0000FFFF, 0x00000040), "matches no row"),
    ],
)
def test_what_cannot_be_decoded_stays_with_a_human(text: str, why: str) -> None:
    found = fault_of(145, text)
    assert found.playbook == CATALOG.xid_playbook(145) == "ask-human"
    assert why in found.detail


def test_the_line_is_read_from_a_label_too() -> None:
    text = line(145, "RLW_REMAP Fatal", 0x00000082, 0x00000040)
    found = classify(subject_of(alert(145, "", err_msg=text)), CATALOG)
    assert found is not None and found.playbook == "reset-gpu"
    assert fits("------000000----------0010000010", 0x00000082)
