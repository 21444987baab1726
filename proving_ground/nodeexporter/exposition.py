"""node-exporter's ``/metrics`` as it writes it: the families the stand-in serves, their help texts,
and the text format of Prometheus' Go client.

Owns only the wire shape, no fault model: help texts and metric names from node-exporter's
``collector/infiniband_linux.go`` and ``collector/netclass_linux.go``, families sorted by name, each
family's samples sorted by their label values, label names sorted, values printed as Go's
``strconv.FormatFloat(v, 'g', -1, 64)`` (``1.8527668e+07``, ``5e+09``, ``61148``), which is what
client_golang's text encoder (``expfmt``) writes. A family without samples is left out, as the
Go client leaves it out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from decimal import Decimal

#: The port counters of ``/sys/class/infiniband/<dev>/ports/<n>/counters`` (and ``counters_ext``,
#: the ``legacy_`` ones) under node-exporter's metric names, with its help texts.
IB_COUNTERS: dict[str, str] = {
    "legacy_multicast_packets_received_total": "Number of multicast packets received",
    "legacy_multicast_packets_transmitted_total": "Number of multicast packets transmitted",
    "legacy_data_received_bytes_total": "Number of data octets received on all links",
    "legacy_packets_received_total": "Number of data packets received on all links",
    "legacy_unicast_packets_received_total": "Number of unicast packets received",
    "legacy_unicast_packets_transmitted_total": "Number of unicast packets transmitted",
    "legacy_data_transmitted_bytes_total": "Number of data octets transmitted on all links",
    "legacy_packets_transmitted_total": "Number of data packets received on all links",
    "excessive_buffer_overrun_errors_total": "Number of times that OverrunErrors consecutive flow control"
    " update periods occurred, each having at least one overrun error.",
    "link_downed_total": "Number of times the link failed to recover from an error state and went down",
    "link_error_recovery_total": "Number of times the link successfully recovered from an error state",
    "local_link_integrity_errors_total": "Number of times that the count of local physical errors exceeded"
    " the threshold specified by LocalPhyErrors.",
    "multicast_packets_received_total": "Number of multicast packets received (including errors)",
    "multicast_packets_transmitted_total": "Number of multicast packets transmitted (including errors)",
    "port_constraint_errors_received_total": "Number of packets received on the switch physical port that"
    " are discarded",
    "port_constraint_errors_transmitted_total": "Number of packets not transmitted from the switch physical"
    " port",
    "port_data_received_bytes_total": "Number of data octets received on all links",
    "port_data_transmitted_bytes_total": "Number of data octets transmitted on all links",
    "port_discards_received_total": "Number of inbound packets discarded by the port because the port is"
    " down or congested",
    "port_discards_transmitted_total": "Number of outbound packets discarded by the port because the port is"
    " down or congested",
    "port_errors_received_total": "Number of packets containing an error that were received on this port",
    "port_packets_received_total": "Number of packets received on all VLs by this port (including errors)",
    "port_packets_transmitted_total": "Number of packets transmitted on all VLs from this port (including"
    " errors)",
    "port_transmit_wait_total": "Number of ticks during which the port had data to transmit but no data was"
    " sent during the entire tick",
    "unicast_packets_received_total": "Number of unicast packets received (including errors)",
    "unicast_packets_transmitted_total": "Number of unicast packets transmitted (including errors)",
    "port_receive_remote_physical_errors_total": "Number of packets marked with the EBP (End of Bad Packet)"
    " delimiter received on the port.",
    "port_receive_switch_relay_errors_total": "Number of packets that could not be forwarded by the switch.",
    "symbol_error_total": "Number of minor link errors detected on one or more physical lanes.",
    "vl15_dropped_total": "Number of incoming VL15 packets dropped due to resource limitations.",
}
IB_GAUGES: dict[str, str] = {
    "physical_state_id": "Physical state of the InfiniBand port (0: no change, 1: sleep, 2: polling,"
    " 3: disable, 4: shift, 5: link up, 6: link error recover, 7: phytest)",
    "rate_bytes_per_second": "Maximum signal transfer rate",
    "state_id": "State of the InfiniBand port (0: no change, 1: down, 2: init, 3: armed, 4: active,"
    " 5: act defer)",
}
IB_INFO_HELP = "Non-numeric data from /sys/class/infiniband/<device>, value is always 1."
#: netclass properties (``Network device property: <name>``); the ``_total`` ones are counters.
NET_PROPERTIES = (
    "address_assign_type",
    "carrier",
    "carrier_changes_total",
    "carrier_up_changes_total",
    "carrier_down_changes_total",
    "device_id",
    "dormant",
    "flags",
    "iface_id",
    "iface_link",
    "iface_link_mode",
    "mtu_bytes",
    "name_assign_type",
    "net_dev_group",
    "speed_bytes",
    "transmit_queue_length",
    "protocol_type",
)
NET_UP_HELP = "Value is 1 if operstate is 'up', 0 otherwise."
NET_INFO_HELP = "Non-numeric data from /sys/class/net/<iface>, value is always 1."
SCRAPE_HELP = {
    "node_scrape_collector_duration_seconds": "node_exporter: Duration of a collector scrape.",
    "node_scrape_collector_success": "node_exporter: Whether a collector succeeded.",
}

#: One sample: its labels and value.
Sample = tuple[Mapping[str, str], float]


def go_float(value: float) -> str:
    """``strconv.FormatFloat(value, 'g', -1, 64)``, as client_golang's text format writes a value."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "-0" if math.copysign(1, value) < 0 else "0"
    sign, digits, exponent = Decimal(repr(float(value))).normalize().as_tuple()
    assert isinstance(exponent, int)
    text = "".join(map(str, digits))
    point = exponent + len(text) - 1  # the decimal exponent of the first digit
    head = "-" if sign else ""
    if point < -4 or point >= 6:  # shortest form: %e from exponent 6 (Go's eprec for 'g', -1)
        mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
        return f"{head}{mantissa}e{'-' if point < 0 else '+'}{abs(point):02d}"
    return f"{head}{abs(value):.{max(len(text) - point - 1, 0)}f}"


def _labels(labels: Mapping[str, str]) -> str:
    def escaped(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return ",".join(f'{name}="{escaped(labels[name])}"' for name in sorted(labels))


def render(families: Iterable[tuple[str, str, str, list[Sample]]]) -> str:
    """``(name, help, type, samples)`` as the Go client writes them: sorted, empty families left out."""
    lines: list[str] = []
    for name, help_text, kind, samples in sorted(families, key=lambda f: f[0]):
        if not samples:
            continue
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        ordered = sorted(samples, key=lambda s: [s[0][k] for k in sorted(s[0])])
        lines += [f"{name}{{{_labels(labels)}}} {go_float(value)}" for labels, value in ordered]
    return "\n".join(lines) + "\n" if lines else ""
