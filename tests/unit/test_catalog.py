"""The fault catalog, table-tested against the policy it must encode.

Cases: every XID and fault entry plans the playbook the spec asks for; application XIDs
never plan a node action; unknown XIDs and faults plan ``ask-human`` (the unknown codes are
asserted unknown, never skipped); an XID beside a catalog fault label decides; XID 154 follows the
recovery action in its message; overrides apply; a broken catalog is refused; a link fault
names its port (key, Slurm reason words, description) and takes the node out with Slurm DOWN, and
proves the job resumed, while a rising error rate only notifies; a ``device`` label that is no
device name is not shown.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from bot.config import ConfigError, load_catalog, load_playbooks
from bot.domain.catalog import Catalog, Override
from bot.domain.faults import classify
from bot.domain.labels import Subject
from bot.domain.planner import plan
from bot.domain.policy import Mode, Policy
from bot.engine.steps import REGISTRY

MUTATING = frozenset(name for name, step in REGISTRY.items() if step.mutating)

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
CATALOG = load_catalog()
PLAYBOOKS = load_playbooks()
AUTO = Policy(mode=Mode.AUTO)

# The spec's bucket → playbook table, written out independently of the data file.
SPEC_BUCKETS = {
    "IGNORE": "ignore",
    "RESTART_APP": "notify-only",
    "RESET_GPU": "reset-gpu",
    "WORKFLOW_XID_48": "reset-gpu",
    "RESTART_BM": "replace-node",
    "RESTART_VM": "replace-node",
    "CONTACT_SUPPORT": "cordon-and-ask",
    "CHECK_MECHANICALS": "cordon-and-ask",
    # Buckets the spec does not name: pitcrew's documented choices (docs/catalog.md).
    "WORKFLOW_XID_45": "notify-only",  # preemptive cleanup, follows an application error
    "WORKFLOW_NVLINK_ERR": "cordon-and-ask",
    "WORKFLOW_NVLINK5_ERR": "ask-human",  # most subcodes harmless; fatal ones come with XID 154
    "CHECK_UVM": "ask-human",
    "UPDATE_SWFW": "cordon-and-ask",
}
# Entries whose playbook deliberately differs from their bucket, with the spec's reason.
SPEC_EXCEPTIONS = {
    64: "replace-node",  # row-remap failure: replace
    154: "ask-human",  # resolved from the message; without one a human decides
    74: "reset-gpu",  # NVIDIA's condition text: a GPU reset or node reboot is needed to clear it
    94: "reset-gpu",  # NVIDIA: reset when convenient; the job finishes first (DRAIN)
}
REQUIRED_XIDS = [
    8,
    13,
    31,
    32,
    43,
    45,
    46,
    48,
    54,
    61,
    62,
    63,
    64,
    68,
    69,
    74,
    79,
    92,
    94,
    95,
    109,
    110,
    119,
    120,
    121,
    136,
    140,
    143,
    *range(144, 152),
    154,
    155,
    156,
    157,
    158,
]
APPLICATION_XIDS = [13, 31, 43, 45, 68, 69]
FAULTS = {
    "ecc-dbe": "reset-gpu",
    "row-remap-failure": "replace-node",
    "row-remap-pending": "reset-gpu",
    "remapped-rows-uncorrectable": "reset-gpu",
    "gpu-missing": "replace-node",
    "health-fail": "cordon-and-ask",
    "exporter-down": "notify-only",
    "nvlink-errors": "cordon-and-ask",
    "thermal": "notify-only",
    "link-down": "isolate-node",
    "link-flapping": "isolate-node",
    "link-errors": "notify-only",
    "slurm-node-out": "follow-slurm",
    "job-hung": "notify-only",
}


def subject(
    xid: int | None = None, fault: str | None = None, message: str = "", action: str | None = None
) -> Subject:
    return Subject(
        node="gpu-node-02",
        gpu="3",
        gpu_uuid=None,
        pci_bus_id=None,
        xid=xid,
        xid_text=str(xid) if xid is not None else None,
        fault_label=fault,
        message=message,
        recovery_action=action,
    )


def planned(s: Subject, catalog: Catalog = CATALOG) -> tuple[str, tuple[str, ...]]:
    fault = classify(s, catalog)
    assert fault is not None
    p = plan("gpu-node-02", [fault], [], AUTO, PLAYBOOKS, NOW, REGISTRY)
    return p.playbook, p.steps


def test_catalog_covers_the_required_xids_and_faults() -> None:
    assert set(REQUIRED_XIDS) <= set(CATALOG.xids)
    assert set(FAULTS) == set(CATALOG.faults)
    assert CATALOG.version


@pytest.mark.parametrize("code", sorted(CATALOG.xids))
def test_every_xid_entry_plans_its_spec_playbook(code: int) -> None:
    entry = CATALOG.xids[code]
    expected = SPEC_EXCEPTIONS.get(code) or entry.playbook or SPEC_BUCKETS.get(entry.bucket)
    if entry.fault_class == "application":
        assert expected in {"ignore", "notify-only"}
    assert expected is not None, f"XID {code}: bucket {entry.bucket} needs an explicit playbook"
    playbook, _ = planned(subject(xid=code))
    assert playbook == expected
    if entry.playbook is None:
        assert playbook == SPEC_BUCKETS.get(entry.bucket, playbook)


@pytest.mark.parametrize(("name", "expected"), sorted(FAULTS.items()))
def test_every_fault_entry_plans_its_spec_playbook(name: str, expected: str) -> None:
    playbook, _ = planned(subject(fault=name))
    assert playbook == expected


@pytest.mark.parametrize("code", APPLICATION_XIDS)
def test_application_xids_never_plan_a_node_action(code: int) -> None:
    playbook, steps = planned(subject(xid=code))
    assert playbook in {"ignore", "notify-only"}
    assert not set(steps) & MUTATING


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (79, "replace-node"),
        (151, "replace-node"),
        (64, "replace-node"),
        (48, "reset-gpu"),
        (46, "reset-gpu"),
        (62, "reset-gpu"),
        (95, "reset-gpu"),
        (109, "reset-gpu"),
        (119, "reset-gpu"),
        (120, "reset-gpu"),
        (140, "reset-gpu"),
        (143, "reset-gpu"),
    ],
)
def test_named_xids(code: int, expected: str) -> None:
    assert planned(subject(xid=code))[0] == expected


@pytest.mark.parametrize("code", [1, 999, 4242])
def test_unknown_xid_goes_to_a_human(code: int) -> None:
    # Never a skip: were the catalog to learn one of these, the case would test nothing.
    assert code not in CATALOG.xids, f"the catalog now knows XID {code}: pick a code it does not"
    playbook, steps = planned(subject(xid=code))
    assert playbook == "ask-human"
    assert not set(steps) & MUTATING


@pytest.mark.parametrize(
    ("xid", "fault"),
    [(79, "thermal"), (13, "row-remap-failure"), (48, "gpu-missing"), (13, "ecc-dbe")],
)
def test_an_xid_wins_over_a_catalog_fault_label(xid: int, fault: str) -> None:
    """A rule may label an XID alert with a catalog fault (``fault: ecc-dbe``); the XID it carries
    is the more precise fact and decides the playbook."""
    assert CATALOG.faults[fault].playbook != CATALOG.xid_playbook(xid)  # the case can tell them apart
    found = classify(subject(xid=xid, fault=fault), CATALOG)
    assert found is not None and (found.kind, found.xid) == ("xid", xid)
    assert planned(subject(xid=xid, fault=fault))[0] == CATALOG.xid_playbook(xid)


def test_unknown_fault_and_garbage_xid_go_to_a_human() -> None:
    assert planned(subject(fault="cosmic-rays"))[0] == "ask-human"
    weird = Subject("n", "1", None, None, None, "seventy-nine", "xid", "")
    fault = classify(weird, CATALOG)
    assert fault is not None
    assert fault.playbook == "ask-human"
    assert "not an XID" in fault.detail


@pytest.mark.parametrize(
    ("message", "action", "expected"),
    [
        ("GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", None, "reset-gpu"),
        ("GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)", None, "reboot-node"),
        ("GPU recovery action changed from 0x1 (Reset Required) to 0x0 (None)", None, "ignore"),
        ("GPU Recovery Action Changed", None, "ask-human"),
        ("GPU Recovery Action Changed", "1", "reset-gpu"),
        ("GPU Recovery Action Changed", "2", "reboot-node"),
        ("GPU Recovery Action Changed", "0", "ignore"),
    ],
)
def test_xid154_follows_the_recovery_action(message: str, action: str | None, expected: str) -> None:
    assert planned(subject(xid=154, message=message, action=action))[0] == expected


@pytest.mark.parametrize("code", [74, 94])
def test_reset_when_needed_lets_the_job_finish_first(code: int) -> None:
    """XID 74 (a reset clears it) and XID 94 (reset when convenient) kill no job: DRAIN, then reset."""
    fault = classify(subject(xid=code), CATALOG)
    assert fault is not None and not fault.job_fatal
    p = plan("gpu-node-02", [fault], [], AUTO, PLAYBOOKS, NOW, REGISTRY)
    assert (p.playbook, p.slurm_action) == ("reset-gpu", "drain")
    assert "reset_gpu" in p.steps


def test_xid159_waits_for_a_human_unless_the_site_says() -> None:
    assert planned(subject(xid=159))[0] == "ask-human"
    for playbook in ("reset-gpu", "ignore"):
        assert (
            planned(subject(xid=159), CATALOG.with_overrides({"159": Override(playbook=playbook)}))[0]
            == playbook
        )


def test_xid79_can_be_configured_to_reboot() -> None:
    changed = CATALOG.with_overrides({"79": Override(playbook="reboot-node")})
    assert planned(subject(xid=79), changed)[0] == "reboot-node"
    assert planned(subject(xid=79))[0] == "replace-node"


def test_overrides_for_unknown_entries_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown xid"):
        CATALOG.with_overrides({"99999": Override(playbook="ignore")})
    with pytest.raises(ValueError, match="unknown fault"):
        CATALOG.with_overrides({"nope": Override(playbook="ignore")})


def test_a_broken_catalog_file_is_refused_with_the_reason(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "catalog.yaml"
    path.write_text(
        "version: x\nsource: y\nbucket_playbooks: {}\nxids:\n  79: {mnemonic: M, meaning: m, bucket: B,"
        " class: gpu-lost, job_fatal: true}\nfaults: {}\n"
    )
    with pytest.raises(ConfigError, match="bucket 'B' has no entry"):
        load_catalog(path)
    path.write_text("xids: [")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_catalog(path)


def link_subject(fault: str, device: str = "mlx5_0", port: str = "1") -> Subject:
    return Subject(
        node="gpu-node-02",
        gpu=None,
        gpu_uuid=None,
        pci_bus_id=None,
        xid=None,
        xid_text=None,
        fault_label=fault,
        message="The link went down 3 times in 15m (at least 3)",
        link=f"{device} port {port}" if port else device,
    )


@pytest.mark.parametrize("fault", ["link-down", "link-flapping"])
def test_a_down_or_flapping_link_isolates_the_node_and_names_the_port(fault: str) -> None:
    found = classify(link_subject(fault), CATALOG)
    assert found is not None
    assert (found.key, found.short) == (f"{fault}@mlx5_0/1", f"{fault} mlx5_0 port 1")
    assert found.describe().startswith(f"{fault} on mlx5_0 port 1 (")
    assert found.detail == "The link went down 3 times in 15m (at least 3)"
    p = plan("gpu-node-02", [found], [], AUTO, PLAYBOOKS, NOW, REGISTRY)
    assert p.steps == ("notify", "slurm_down", "cordon", "confirm_resumed", "close")
    assert p.slurm_action == "down"
    assert p.summary == f"{fault} mlx5_0 port 1"


def test_two_ports_of_a_node_are_two_faults_and_an_ethernet_link_has_no_port() -> None:
    first, second = (classify(link_subject("link-down", port=n), CATALOG) for n in ("1", "2"))
    assert first is not None and second is not None and first.key != second.key
    ethernet = classify(link_subject("link-down", device="ens1f0", port=""), CATALOG)
    assert ethernet is not None and ethernet.short == "link-down ens1f0"


def test_a_rising_link_error_rate_only_notifies() -> None:
    playbook, steps = planned(link_subject("link-errors"))
    assert playbook == "notify-only"
    assert not set(steps) & MUTATING


def test_link_labels_that_name_no_device_are_not_shown() -> None:
    from bot.domain.alerts import Alert
    from bot.domain.labels import subject_of

    def link_of(**labels: str) -> str | None:
        alert = Alert.model_validate(
            {
                "status": "firing",
                "labels": {"alertname": "NetworkLinkDown", "node": "gpu-node-01", **labels},
                "annotations": {},
                "startsAt": "2026-11-29T12:00:00Z",
                "endsAt": "0001-01-01T00:00:00Z",
                "generatorURL": "",
                "fingerprint": "0123456789abcdef",
            }
        )
        return subject_of(alert).link

    assert link_of(device="mlx5_0", port="1") == "mlx5_0 port 1"
    assert link_of(device="ens1f0") == "ens1f0"
    assert link_of(device="mlx5_0", port="1 State=RESUME") == "mlx5_0"
    assert link_of(device="eth0\nReason=x") is None
    assert link_of() is None


# NVIDIA bucket -> the playbooks that are its plain equivalent; NVSentinel's action per bucket -> same.
PLAIN = {
    "IGNORE": {"ignore"},
    "RESTART_APP": {"notify-only"},
    "RESET_GPU": {"reset-gpu"},
    "WORKFLOW_XID_48": {"reset-gpu"},
    "RESTART_BM": {"reboot-node"},
    "RESTART_VM": {"reboot-node"},
    "CONTACT_SUPPORT": {"cordon-and-ask", "ask-human"},
    "CHECK_MECHANICALS": {"cordon-and-ask"},
    "UPDATE_SWFW": {"cordon-and-ask", "ask-human"},
    "XID_154": {"ask-human"},
    "CHECK_UVM": {"ask-human"},
    "WORKFLOW_XID_45": {"notify-only"},
    "WORKFLOW_NVLINK_ERR": {"cordon-and-ask", "ask-human"},
    "WORKFLOW_NVLINK5_ERR": {"ask-human"},
}
NVSENTINEL = {"IGNORE": "none", "RESTART_APP": "none", "RESET_GPU": "reset", "WORKFLOW_XID_48": "reset"}
NVSENTINEL |= {"RESTART_BM": "restart", "RESTART_VM": "restart"}
NVSENTINEL_PLAIN = {
    "none": {"ignore", "notify-only"},
    "reset": {"reset-gpu"},
    "restart": {"reboot-node"},
    "contact": {"cordon-and-ask", "ask-human"},
}


def differing_xids_in_the_docs() -> set[int]:
    from pathlib import Path

    text = (Path(__file__).parents[2] / "docs" / "catalog.md").read_text()
    title = "## Where pitcrew differs from NVIDIA's bucket or NVSentinel's"
    section = text.split(title, 1)[1].split("\n## ", 1)[0]
    found: set[int] = set()
    for row in section.splitlines():
        if not row.startswith("| ") or row.startswith("| Xid") or row.startswith("|---"):
            continue
        for part in row.split("|")[1].split(","):
            first, _, last = part.strip().partition("\u2013")  # an en dash, as the docs write ranges
            found |= set(range(int(first), int(last or first) + 1))
    return found


def test_the_docs_list_every_xid_where_pitcrew_differs() -> None:
    differing = {
        code
        for code, entry in CATALOG.xids.items()
        if (playbook := CATALOG.xid_playbook(code)) not in PLAIN.get(entry.bucket, set())
        or playbook not in NVSENTINEL_PLAIN[NVSENTINEL.get(entry.bucket, "contact")]
    }
    assert {64, 74, 79, 94} <= differing  # the case can tell
    assert differing <= differing_xids_in_the_docs()
