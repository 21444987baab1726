"""One node as node-exporter's ``infiniband`` and ``netclass`` collectors see it, with link faults.

Owns the state the exporter reads from sysfs - per InfiniBand/RoCE port its state, physical state,
rate and counters (``/sys/class/infiniband/<dev>/ports/<n>/``), per interface its carrier, carrier
change counters, operstate and admin state (``/sys/class/net/<iface>/``) - and what each injected
fault does to it, as the kernel would:

* ``port_down``: state DOWN (1), physical state Polling (2: no peer), ``link_downed`` + 1;
* ``flap``: ``link_downed`` + 1 per flap, the port ACTIVE again after each (a scrape in between
  may never see it down; the counter does);
* ``disable``: an administrator's ``ibportstate ... disable``: state DOWN, physical state
  Disabled (3);
* ``errors`` / ``error_rate``: symbol, receive and link-recovery counters grow, at once or with time;
* ``reboot``: the sysfs counters start again at 0 (the kernel's, not the exporter's);
* ``carrier_down`` / ``carrier_up`` on an interface: carrier 0/1, ``carrier_changes`` and the
  down/up counters + 1, operstate ``down``/``up``; ``admin_down``: the interface set down, whose
  ``carrier`` sysfs read fails, so node-exporter exports no ``carrier`` for it (``adminstate="down"``).

A node with ``ib_ports=()`` has no InfiniBand: the collector returns no data, so no
``node_infiniband_*`` series and ``node_scrape_collector_success{collector="infiniband"} 0``.
Thread-safe: faults arrive from test threads while Prometheus scrapes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from proving_ground.nodeexporter.exposition import (
    IB_COUNTERS,
    IB_GAUGES,
    IB_INFO_HELP,
    NET_INFO_HELP,
    NET_PROPERTIES,
    NET_UP_HELP,
    SCRAPE_HELP,
    Sample,
    render,
)

ACTIVE, DOWN = 4, 1  # ports/<n>/state
LINK_UP, POLLING, DISABLED = 5, 2, 3  # ports/<n>/phys_state
#: What ``/sys/class/infiniband/mlx5_*/ports/1/counters`` holds on a ConnectX HCA (no ``counters_ext``).
MLX5_COUNTERS = tuple(name for name in IB_COUNTERS if not name.startswith("legacy_"))
#: ``ifup`` flags of an interface that is up (IFF_UP|IFF_BROADCAST|IFF_RUNNING|IFF_MULTICAST...).
FLAGS_UP, FLAGS_DOWN = 4099, 4098
#: The error counters ``errors``/``error_rate`` feed.
ERROR_COUNTERS = {
    "symbol": "symbol_error_total",
    "receive": "port_errors_received_total",
    "recovery": "link_error_recovery_total",
}


#: Counters Linux reads from the port's PortCounters attribute, at its widths (drivers/infiniband/
#: core/sysfs.c, ``PORT_PMA_ATTR``): they clamp at all ones instead of wrapping (InfiniBand's
#: performance counters; a full one stays full until cleared).
WIDTHS = {
    "symbol_error_total": 16,
    "link_error_recovery_total": 8,
    "link_downed_total": 8,
    "port_errors_received_total": 16,
    "port_receive_remote_physical_errors_total": 16,
    "port_receive_switch_relay_errors_total": 16,
    "port_discards_transmitted_total": 16,
    "port_constraint_errors_transmitted_total": 8,
    "port_constraint_errors_received_total": 8,
    "local_link_integrity_errors_total": 4,
    "excessive_buffer_overrun_errors_total": 4,
    "vl15_dropped_total": 16,
}


@dataclass
class IbPort:
    device: str
    port: int
    state: int = ACTIVE
    phys_state: int = LINK_UP
    rate: float = 5e10  # 400 Gb/s NDR, in bytes per second as the collector reports it
    counters: dict[str, float] = field(default_factory=lambda: dict.fromkeys(MLX5_COUNTERS, 0.0))
    #: Errors a second accruing since a moment (monotonic): a slowly degrading link.
    rates: dict[str, tuple[float, float]] = field(default_factory=dict)

    def value(self, counter: str, now: float) -> float:
        base = self.counters[counter]
        if counter in self.rates:
            per_second, since = self.rates[counter]
            base += int(per_second * (now - since))
        return min(base, 2 ** WIDTHS[counter] - 1) if counter in WIDTHS else base


@dataclass
class Interface:
    device: str
    address: str
    admin_up: bool = True
    carrier: int = 1
    properties: dict[str, float] = field(default_factory=dict)

    @property
    def operstate(self) -> str:
        return "up" if self.admin_up and self.carrier else "down"


class Node:
    """One node's node-exporter (``infiniband`` and ``netclass`` collectors)."""

    def __init__(
        self,
        name: str,
        *,
        ib_ports: Sequence[tuple[str, int]] = (("mlx5_0", 1),),
        interfaces: Sequence[str] = ("eth0",),
        board_id: str = "MT_0000000838",
        firmware: str = "28.39.1002",
        hca_type: str = "MT4129",
    ) -> None:
        self.name = name
        self._lock = threading.Lock()
        hca = {"board_id": board_id, "firmware_version": firmware, "hca_type": hca_type}
        #: ``node_infiniband_info``'s labels per device (``board_id``, ``firmware_version``, ``hca_type``).
        self.hcas = {device: dict(hca) for device, _ in ib_ports}
        self.ports = {(d, p): IbPort(d, p) for d, p in ib_ports}
        self.interfaces = {
            dev: Interface(dev, f"02:00:00:00:{i // 256:02x}:{i % 256:02x}")
            for i, dev in enumerate(interfaces)
        }
        for iface in self.interfaces.values():
            iface.properties = {
                "address_assign_type": 0,
                "carrier_changes_total": 2,  # down and up once while booting
                "carrier_up_changes_total": 1,
                "carrier_down_changes_total": 1,
                "device_id": 0,
                "dormant": 0,
                "flags": FLAGS_UP,
                "iface_id": 2 + list(self.interfaces).index(iface.device),
                "iface_link": 2 + list(self.interfaces).index(iface.device),
                "iface_link_mode": 0,
                "mtu_bytes": 9000,
                "name_assign_type": 4,
                "net_dev_group": 0,
                "speed_bytes": 1.25e10,  # 100 Gb/s
                "transmit_queue_length": 1000,
                "protocol_type": 1,
            }

    # ------------------------------------------------------------------ faults
    def port(self, device: str, port: int = 1) -> IbPort:
        return self.ports[(device, port)]

    def port_down(self, device: str, port: int = 1) -> None:
        with self._lock:
            p = self.port(device, port)
            if p.state != DOWN:
                p.counters["link_downed_total"] += 1
            p.state, p.phys_state = DOWN, POLLING

    def port_up(self, device: str, port: int = 1) -> None:
        with self._lock:
            p = self.port(device, port)
            p.state, p.phys_state = ACTIVE, LINK_UP

    def flap(self, device: str, port: int = 1, times: int = 1) -> None:
        with self._lock:
            p = self.port(device, port)
            p.counters["link_downed_total"] += times
            p.state, p.phys_state = ACTIVE, LINK_UP

    def disable(self, device: str, port: int = 1) -> None:
        with self._lock:
            p = self.port(device, port)
            p.state, p.phys_state = DOWN, DISABLED

    def errors(self, device: str, port: int = 1, **counts: int) -> None:
        """Add errors now: ``errors("mlx5_0", symbol=40, receive=3)``."""
        with self._lock:
            p = self.port(device, port)
            for kind, count in counts.items():
                p.counters[ERROR_COUNTERS[kind]] += count

    def error_rate(self, device: str, port: int = 1, **per_second: float) -> None:
        """Errors accruing from now on: ``error_rate("mlx5_0", symbol=2.0)``."""
        with self._lock:
            p, now = self.port(device, port), time.monotonic()
            for kind, rate in per_second.items():
                counter = ERROR_COUNTERS[kind]
                p.counters[counter] = p.value(counter, now)
                p.rates[counter] = (rate, now)

    def reboot(self) -> None:
        with self._lock:
            for p in self.ports.values():
                p.counters = dict.fromkeys(p.counters, 0.0)
                p.rates.clear()
                p.state, p.phys_state = ACTIVE, LINK_UP

    def carrier_down(self, device: str) -> None:
        with self._lock:
            iface = self.interfaces[device]
            if iface.carrier:
                iface.carrier = 0
                self._count_change(iface, "down")

    def carrier_up(self, device: str) -> None:
        with self._lock:
            iface = self.interfaces[device]
            if not iface.carrier:
                iface.carrier = 1
                self._count_change(iface, "up")

    def admin_down(self, device: str) -> None:
        with self._lock:
            iface = self.interfaces[device]
            iface.admin_up = False
            iface.properties["flags"] = FLAGS_DOWN

    def clear(self) -> None:
        """Every port ACTIVE, every interface up with carrier, no error rates (counters stay)."""
        with self._lock:
            for p in self.ports.values():
                p.state, p.phys_state = ACTIVE, LINK_UP
                for counter in list(p.rates):
                    p.counters[counter] = p.value(counter, time.monotonic())
                p.rates.clear()
            for iface in self.interfaces.values():
                if not iface.carrier:
                    iface.carrier = 1
                    self._count_change(iface, "up")
                iface.admin_up = True
                iface.properties["flags"] = FLAGS_UP

    @staticmethod
    def _count_change(iface: Interface, direction: str) -> None:
        iface.properties["carrier_changes_total"] += 1
        iface.properties[f"carrier_{direction}_changes_total"] += 1

    # --------------------------------------------------------------- exposition
    def render(self) -> str:
        with self._lock:
            return render([*self._infiniband(), *self._netclass(), *self._scrape()])

    def _infiniband(self) -> list[tuple[str, str, str, list[Sample]]]:
        now = time.monotonic()
        families: list[tuple[str, str, str, list[Sample]]] = []
        info: list[Sample] = [({"device": d, **labels}, 1.0) for d, labels in self.hcas.items()]
        families.append(("node_infiniband_info", IB_INFO_HELP, "gauge", info))
        for name, help_text in IB_GAUGES.items():
            attribute = {
                "physical_state_id": "phys_state",
                "state_id": "state",
                "rate_bytes_per_second": "rate",
            }
            samples: list[Sample] = [
                (_port_labels(p), float(getattr(p, attribute[name]))) for p in self.ports.values()
            ]
            families.append((f"node_infiniband_{name}", help_text, "gauge", samples))
        for name, help_text in IB_COUNTERS.items():
            samples = [
                (_port_labels(p), p.value(name, now)) for p in self.ports.values() if name in p.counters
            ]
            families.append((f"node_infiniband_{name}", help_text, "counter", samples))
        return families

    def _netclass(self) -> list[tuple[str, str, str, list[Sample]]]:
        ifaces = list(self.interfaces.values())
        families: list[tuple[str, str, str, list[Sample]]] = [
            ("node_network_up", NET_UP_HELP, "gauge", [({"device": i.device}, float(i.operstate == "up")) for i in ifaces]),
            ("node_network_info", NET_INFO_HELP, "gauge", [(_info_labels(i), 1.0) for i in ifaces]),
        ]  # fmt: skip
        for prop in NET_PROPERTIES:
            samples: list[Sample] = []
            for iface in ifaces:
                value = float(iface.carrier) if prop == "carrier" else iface.properties.get(prop)
                if prop in ("carrier", "speed_bytes") and not iface.admin_up:
                    value = None  # sysfs answers EINVAL for the carrier and speed of a down interface
                elif prop == "speed_bytes" and not iface.carrier:
                    value = -1 * 1000 * 1000 / 8  # speed reads -1 without carrier; the collector keeps it
                if value is not None:
                    samples.append(({"device": iface.device}, value))
            kind = "counter" if prop.endswith("_total") else "gauge"
            families.append((f"node_network_{prop}", f"Network device property: {prop}", kind, samples))
        return families

    def _scrape(self) -> list[tuple[str, str, str, list[Sample]]]:
        success = {"infiniband": 1.0 if self.ports else 0.0, "netclass": 1.0}
        return [
            (name, help_text, "gauge", [({"collector": c}, v if "success" in name else 0.000_25) for c, v in success.items()])
            for name, help_text in SCRAPE_HELP.items()
        ]  # fmt: skip


def _port_labels(port: IbPort) -> dict[str, str]:
    return {"device": port.device, "port": str(port.port)}


def _info_labels(iface: Interface) -> dict[str, str]:
    return {
        "address": iface.address,
        "adminstate": "up" if iface.admin_up else "down",
        "broadcast": "ff:ff:ff:ff:ff:ff",
        "device": iface.device,
        "duplex": "full" if iface.operstate == "up" else "",
        "ifalias": "",
        "operstate": iface.operstate,
    }
