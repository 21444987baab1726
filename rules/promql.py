"""PromQL building blocks for pitcrew's rules: label normalisation, per-GPU aggregation, XID classes.

Owns the two decisions every GPU rule shares, so no rule spells them differently: which labels an
alert keeps (``cluster, node, gpu, UUID``: pod, namespace, container, instance and the exporter's
host label are aggregated away, so workload churn and exporter restarts or upgrades never make a new
alert) and where ``node`` comes from (the target label relabelled from
``__meta_kubernetes_pod_node_name``, else dcgm-exporter's ``Hostname``, else its 4.6+ spelling
``hostname``). Also reads which XIDs page from pitcrew's own catalog, so the rules and pitcrew never
disagree. Pure functions of strings; rules/render.py assembles the rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

CATALOG = Path(__file__).resolve().parents[1] / "bot" / "data" / "catalog.yaml"
# NVIDIA's "Resolution Bucket (Immediate Action)". Critical: the GPU or node must be reset, rebooted or
# replaced. Never paged: the application is at fault (RESTART_APP), the event is informational
# (IGNORE), or it follows another XID (45) - unless pitcrew's catalog gives the XID a playbook of its
# own (94: reset the GPU when convenient; 92, 157, 163-165: a notice), which must reach pitcrew or
# the entry is dead. Every other code - CONTACT_SUPPORT, CHECK_MECHANICALS, the NVLink workflows,
# 154, codes the catalog does not know - pages as a warning: an XID nobody has classified reaches a
# human instead of being dropped.
CRITICAL_BUCKETS = ("RESET_GPU", "RESTART_BM", "RESTART_VM", "WORKFLOW_XID_48")
NO_PAGE_BUCKETS = ("RESTART_APP", "IGNORE", "WORKFLOW_XID_45")

EXPORTER_JOB = ".*dcgm-exporter.*"  # Helm chart: dcgm-exporter; GPU Operator: nvidia-dcgm-exporter
GPU = "cluster, node, gpu, UUID"


@dataclass(frozen=True)
class XidClasses:
    version: str  # the catalog's, printed in the generated files' header
    critical: tuple[int, ...]
    no_page: tuple[int, ...]
    #: The XID that says the driver's recovery action changed (NVIDIA's bucket XID_154).
    recovery: int


def xid_classes(catalog: Path = CATALOG) -> XidClasses:
    data = yaml.safe_load(catalog.read_text())
    buckets = {int(code): entry["bucket"] for code, entry in data["xids"].items()}
    own = frozenset(
        int(code) for code, entry in data["xids"].items() if entry.get("playbook") not in (None, "ignore")
    )

    def codes(wanted: tuple[str, ...], but: frozenset[int] = frozenset()) -> tuple[int, ...]:
        return tuple(sorted(code for code, bucket in buckets.items() if bucket in wanted and code not in but))

    (recovery,) = codes(("XID_154",))
    return XidClasses(str(data["version"]), codes(CRITICAL_BUCKETS), codes(NO_PAGE_BUCKETS, own), recovery)


def node_fold(expr: str) -> str:
    """``expr`` with ``node`` set to the first non-empty of ``node``, ``Hostname``, ``hostname``."""
    return (
        f'label_replace(label_join({expr}, "pitcrew_node", ";", "node", "Hostname", "hostname"), '
        f'"node", "$1", "pitcrew_node", ";*([^;]+).*")'
    )


def per_gpu(expr: str, *extra: str) -> str:
    """One series per GPU (plus ``extra`` labels), whatever pod or exporter instance reported it."""
    return f"max by ({', '.join((GPU, *extra))}) ({node_fold(expr)})"


def present(metric: str, by: str = "cluster, node, gpu") -> str:
    return f"max by ({by}) ({node_fold(metric)})"


def increased(metric: str, window: str) -> str:
    return f"{per_gpu(f'increase({metric}[{window}])')} > 0"


def exporter_up() -> str:
    return f'max by (cluster, node) (up{{job=~"{EXPORTER_JOB}"}})'


def any_of(*clauses: str) -> str:
    return "\nor\n".join(f"(\n  {clause}\n)" for clause in clauses)


def xid_recent(window: str) -> str:
    """Every (node, GPU, XID) seen within ``window``, from whichever XID signal the exporter offers."""
    total, count = "DCGM_EXP_XID_ERRORS_TOTAL", 'DCGM_EXP_XID_ERRORS_COUNT{xid!=""}'
    gauge = 'label_replace(DCGM_FI_DEV_XID_ERRORS{err_code!~"0|"}, "xid", "$1", "err_code", "(.+)")'
    offered = f"{present('DCGM_EXP_XID_ERRORS_COUNT')} or {present(total)}"
    return any_of(
        # the cumulative counter grew within the window...
        f"{per_gpu(f'increase({total}[{window}])', 'xid')} > 0",
        # ...or was born within it: a series born at 1 has no increase() at all
        f"{per_gpu(total, 'xid')}\n  unless\n  {per_gpu(f'{total} offset {window}', 'xid')}",
        f"{per_gpu(count, 'xid')} > 0",
        # the latched last-XID gauge, only where the exporter offers neither of the above
        f"{per_gpu(gauge, 'xid')}\n  unless on (cluster, node, gpu)\n  ({offered})",
    )


#: The driver's recovery action (NVML ``nvmlDeviceGpuRecoveryAction_t``: 0 none, 1 GPU reset, 2 node
#: reboot, 3 drain P2P, 4 drain and reset), DCGM field 1523 (DCGM 4.5+). XID 154 only says that it
#: changed: dcgm-exporter's ``err_msg`` for it is the fixed "GPU Recovery Action Changed".
RECOVERY_ACTION, RECOVERY_ACTIONS = "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION", range(5)


def with_recovery_action(metric: str, matcher: str, xid: int) -> str:
    """``metric{matcher}`` (``pitcrew:gpu_xid:recent``), its XID ``xid`` series labelled
    ``recovery_action`` with the GPU's recovery action where the exporter reports one (PromQL makes
    no label of a value, hence one branch per action); unlabelled where it does not."""
    action = "\n    or\n    ".join(
        f'label_replace({per_gpu(RECOVERY_ACTION)} == {v}, "recovery_action", "{v}", "", "")'
        for v in RECOVERY_ACTIONS
    )
    one = f'{metric}{{xid="{xid}",{matcher}}}'
    return (
        f"(\n  {one}\n  + on (cluster, node, gpu) group_left (recovery_action)\n  0 * (\n    {action}\n  )\n)"
        f"\nor on ({GPU}, xid)\n{metric}{{{matcher}}}"
    )


def nvlink_burst(window: str, threshold: int) -> str:
    """CRC and replay errors summed over the counters the exporter offers; any recovery error."""
    summed = " or ".join(
        f"label_replace({node_fold(f'increase(DCGM_FI_DEV_NVLINK_{c}_ERROR_COUNT_TOTAL[{window}])')},"
        f' "pitcrew_counter", "{c}", "", "")'
        for c in ("CRC_FLIT", "CRC_DATA", "REPLAY")
    )
    return any_of(
        f"sum by ({GPU}) ({summed}) > {threshold}",
        increased("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", window),
    )


def fields_missing(fields: tuple[str, ...]) -> str:
    """Per field, how many exporters are up but do not export it."""
    missing = "\n  or\n".join(
        f"  label_replace({exporter_up()} == 1 unless on (cluster, node) {present(name, 'cluster, node')},"
        f' "field", "{name}", "", "")'
        for name in fields
    )
    return f"count by (cluster, field) (\n{missing}\n)"


#: A counter that grows whenever the GPU has power (NVML's total energy, mJ): readings are fresh only
#: while it moves. Pre-Volta GPUs have no such counter, and no series: the rule cannot see them.
ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"


def frozen(window: str) -> str:
    """GPUs exported now and a ``window`` ago whose energy counter did not move in between: the
    exporter answers with readings DCGM no longer takes (its host engine hung, or the GPU no longer
    read). Every series of the GPU counts (a pod's churn ends one and begins another). A GPU no
    longer exported (fallen off the bus, its exporter down: stale) is another alert's; one exported
    for less than ``window`` (a new exporter's first readings) is not judged yet."""
    unmoved = f"{per_gpu(f'changes({ENERGY}[{window}])')} == 0"
    return f"\nand on ({GPU})\n".join((unmoved, per_gpu(ENERGY), per_gpu(f"{ENERGY} offset {window}")))


# ----------------------------------------------------------------------------- network links
# node-exporter's infiniband collector (collector/infiniband_linux.go) labels every port series
# ``device, port``; its netclass collector labels every interface series ``device``. RoCE ports are
# InfiniBand-class devices too (link layer Ethernet), but a RoCE port whose Ethernet link is lost
# reads DOWN with physical state Disabled (3), not Polling: the RoCE drivers (mlx5, irdma, ocrdma,
# mana…) report the netdev's carrier that way. node-exporter does not export the link layer, so
# the IB branch cannot tell that from a port an administrator disabled; the Ethernet branch sees the
# lost carrier on the port's netdev, and the counter rules cover both.
IB_PORT = "cluster, node, device, port"
NET_DEVICE = "cluster, node, device"
IB_STATE_DOWN, IB_STATE_ACTIVE, IB_PHYS_DISABLED = 1, 4, 3  # sysfs ports/<n>/state, phys_state


def per_link(expr: str, by: str = IB_PORT) -> str:
    """One series per port (or interface), whatever exporter instance or pod reported it."""
    return f"max by ({by}) ({node_fold(expr)})"


def ib_link_down(seen_window: str) -> str:
    """A port that is DOWN now, was ACTIVE within ``seen_window`` and is not administratively
    disabled: a port never up (an unused second port) or switched off on purpose is no fault."""
    state, phys = "node_infiniband_state_id", "node_infiniband_physical_state_id"
    return (
        f"{per_link(state)} == {IB_STATE_DOWN}\n"
        f"  unless on ({IB_PORT})\n  {per_link(phys)} == {IB_PHYS_DISABLED}\n"
        f"  and on ({IB_PORT})\n  {per_link(f'max_over_time({state}[{seen_window}])')} >= {IB_STATE_ACTIVE}"
    )


def ethernet_link_down(skipped: str, seen_window: str) -> str:
    """Carrier lost on an interface that is administratively up and had carrier within ``seen_window``
    (an interface set down has no ``carrier`` series at all: sysfs refuses the read). ``skipped``:
    the interfaces that are no fabric link (loopback, the pods' veths, bridges, tunnels)."""
    carrier = f'node_network_carrier{{device!~"{skipped}"}}'
    admin_up = f'node_network_info{{device!~"{skipped}",adminstate="up"}}'
    return (
        f"{per_link(carrier, NET_DEVICE)} == 0\n"
        f"  and on ({NET_DEVICE})\n  {per_link(admin_up, NET_DEVICE)}\n"
        f"  and on ({NET_DEVICE})\n  {per_link(f'max_over_time({carrier}[{seen_window}])', NET_DEVICE)} == 1"
    )


def ib_link_flaps(window: str, downs: int) -> str:
    """Ports that went down at least ``downs`` times within ``window`` (``increase`` counts across a
    counter reset, so a reboot that zeroes the counter adds nothing), unless disabled on purpose."""
    counted = per_link(f"increase(node_infiniband_link_downed_total[{window}])")
    phys = per_link("node_infiniband_physical_state_id")
    return f"{counted} >= {downs}\n  unless on ({IB_PORT})\n  {phys} == {IB_PHYS_DISABLED}"


def ethernet_link_flaps(skipped: str, window: str, downs: int) -> str:
    """Interfaces that lost carrier at least ``downs`` times within ``window``: by the down counter
    (Linux 4.16+), else half of all carrier changes."""
    down = per_link(
        f'increase(node_network_carrier_down_changes_total{{device!~"{skipped}"}}[{window}])', NET_DEVICE
    )
    changes = per_link(
        f'increase(node_network_carrier_changes_total{{device!~"{skipped}"}}[{window}])', NET_DEVICE
    )
    return f"(\n  {down}\n  or\n  {changes} / 2\n) >= {downs}"


#: Physical-layer error counters of an IB/RoCE port; their sum per window is the error rate.
IB_ERROR_COUNTERS = (
    ("symbol", "node_infiniband_symbol_error_total"),
    ("receive", "node_infiniband_port_errors_received_total"),
    ("recovery", "node_infiniband_link_error_recovery_total"),
    ("integrity", "node_infiniband_local_link_integrity_errors_total"),
)


#: The IB/RoCE port counters the rules count, at their maximum. Linux reads them from the port's
#: PortCounters attribute at these widths (drivers/infiniband/core/sysfs.c, ``PORT_PMA_ATTR``:
#: link_downed and link_error_recovery 8 bits, symbol_error and port_rcv_errors 16, local link
#: integrity 4), and InfiniBand's error counters stop at all ones instead of wrapping: a full one
#: never increases again, so ``increase()`` over it is 0 until someone clears it (perfquery -R).
IB_COUNTER_MAX = {
    "node_infiniband_link_downed_total": 2**8 - 1,
    "node_infiniband_link_error_recovery_total": 2**8 - 1,
    "node_infiniband_symbol_error_total": 2**16 - 1,
    "node_infiniband_port_errors_received_total": 2**16 - 1,
    "node_infiniband_local_link_integrity_errors_total": 2**4 - 1,
}


def ib_counters_full() -> str:
    """Each port counter at its maximum, labelled ``counter`` (node-exporter's name for it, without
    prefix and ``_total``): the flap and error rules are blind on that port until it is cleared."""
    return "\nor\n".join(
        f'label_replace({per_link(f"{metric} >= {top}")}, "counter", '
        f'"{metric.removeprefix("node_infiniband_").removesuffix("_total")}", "", "")'
        for metric, top in IB_COUNTER_MAX.items()
    )


def ib_link_errors(window: str) -> str:
    """Physical-layer errors per port within ``window``, over the counters the port offers."""
    summed = "\n    or\n    ".join(
        f'label_replace({node_fold(f"increase({metric}[{window}])")}, "pitcrew_counter", "{name}", "", "")'
        for name, metric in IB_ERROR_COUNTERS
    )
    return f"sum by ({IB_PORT}) (\n    {summed}\n  )"
