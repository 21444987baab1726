"""The node-exporter stand-in against node-exporter itself, and against what pitcrew's rules read.

Cases:
- from the sysfs values of node-exporter's own end-to-end fixture (two HCAs: ``mlx4_0`` with ports
  1 and 2, ``i40iw0`` without counters; interfaces ``bond0`` and ``eth0``), the stand-in writes
  the fixture's ``node_infiniband_*`` and netclass ``node_network_*`` families byte for byte
  (``tests/fixtures/nodeexporter/``, cut from ``collector/fixtures/e2e-output.txt``);
- values print as Go's ``FormatFloat(v, 'g', -1, 64)``;
- every ``node_*`` metric pitcrew's rules read is one the stand-in serves, so a misspelt name
  (``port_receive_errors_total`` for ``port_errors_received_total``) fails here;
- the faults move the series as the kernel would: a down port, a flap, a disabled port, a reboot's
  counter reset, a lost carrier, an interface set down (no ``carrier`` series), a node without
  InfiniBand (no ``node_infiniband_*`` at all);
- Prometheus's own parser (``promtool check metrics``) accepts the exposition.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from proving_ground.nodeexporter import IbPort, Node
from proving_ground.nodeexporter.exposition import go_float
from rules import render
from tests.harness.proc import require_binary

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "nodeexporter" / "infiniband-netclass.prom"


def fixture_node() -> Node:
    """The sysfs that node-exporter's fixture was rendered from (its collector/fixtures/sys tree)."""
    node = Node(
        "fixture", ib_ports=(("i40iw0", 1), ("mlx4_0", 1), ("mlx4_0", 2)), interfaces=("bond0", "eth0")
    )
    node.hcas = {
        "i40iw0": {"board_id": "I40IW Board ID", "firmware_version": "0.2", "hca_type": "I40IW"},
        "mlx4_0": {"board_id": "SM_1141000001000", "firmware_version": "2.31.5050", "hca_type": "MT4099"},
    }
    legacy = {
        "legacy_data_received_bytes_total": 18527668,
        "legacy_data_transmitted_bytes_total": 14933760,
        "legacy_multicast_packets_received_total": 93,
        "legacy_multicast_packets_transmitted_total": 16,
        "legacy_packets_received_total": 0,
        "legacy_packets_transmitted_total": 0,
        "legacy_unicast_packets_received_total": 61148,
        "legacy_unicast_packets_transmitted_total": 61239,
    }
    port1 = {
        **legacy,
        "link_downed_total": 0,
        "link_error_recovery_total": 0,
        "multicast_packets_received_total": 93,
        "multicast_packets_transmitted_total": 16,
        "port_constraint_errors_received_total": 0,
        "port_constraint_errors_transmitted_total": 0,
        "port_data_received_bytes_total": 18527668,
        "port_data_transmitted_bytes_total": 14933760,
        "port_discards_received_total": 0,
        "port_discards_transmitted_total": 5,
        "port_errors_received_total": 0,
        "port_packets_received_total": 6825908347,
        "port_packets_transmitted_total": 6235865,
        "port_transmit_wait_total": 4294967295,
        "unicast_packets_received_total": 61148,
        "unicast_packets_transmitted_total": 61239,
    }
    port2 = {
        **legacy,
        **dict.fromkeys(("link_downed_total", "link_error_recovery_total"), 0),
        **dict.fromkeys(("multicast_packets_received_total", "multicast_packets_transmitted_total"), 0),
        **dict.fromkeys(("port_data_received_bytes_total", "port_data_transmitted_bytes_total"), 0),
        **dict.fromkeys(("unicast_packets_received_total", "unicast_packets_transmitted_total"), 0),
    }
    node.ports = {
        ("i40iw0", 1): IbPort("i40iw0", 1, rate=1.25e9, counters={}),
        ("mlx4_0", 1): IbPort("mlx4_0", 1, rate=5e9, counters={k: float(v) for k, v in port1.items()}),
        ("mlx4_0", 2): IbPort("mlx4_0", 2, rate=5e9, counters={k: float(v) for k, v in port2.items()}),
    }
    for iface in node.interfaces.values():
        iface.address = "01:01:01:01:01:01"
        iface.properties = {
            "address_assign_type": 3,
            "carrier_changes_total": 2,
            "carrier_up_changes_total": 1,
            "carrier_down_changes_total": 1,
            "device_id": 32,
            "dormant": 1,
            "flags": 4867,
            "iface_id": 2,
            "iface_link": 2,
            "iface_link_mode": 1,
            "mtu_bytes": 1500,
            "name_assign_type": 2,
            "net_dev_group": 0,
            "transmit_queue_length": 1000,
            "protocol_type": 1,
        }
    node.interfaces["eth0"].properties["speed_bytes"] = 1.25e8  # bond0 has no speed file
    return node


def families(text: str, prefix: tuple[str, ...] = ("node_infiniband_", "node_network_")) -> str:
    """The lines of the families whose names start with ``prefix``, in order."""
    kept, keep = [], False
    for line in text.splitlines(keepends=True):
        if line.startswith("# HELP "):
            keep = line.split()[2].startswith(prefix)
        if keep:
            kept.append(line)
    return "".join(kept)


def test_the_stand_in_writes_node_exporters_own_fixture_byte_for_byte() -> None:
    assert families(fixture_node().render()) == FIXTURE.read_text()


@pytest.mark.parametrize(
    ("value", "text"),
    [(0, "0"), (1, "1"), (61148, "61148"), (18527668, "1.8527668e+07"), (5e9, "5e+09"), (0.00025, "0.00025"),
     (1e-5, "1e-05"), (-125000, "-125000"), (123456, "123456"), (1234567, "1.234567e+06")],
)  # fmt: skip
def test_values_print_as_go_prints_them(value: float, text: str) -> None:
    assert go_float(value) == text


def test_every_node_exporter_metric_the_rules_read_is_served() -> None:
    read = set(re.findall(r"\bnode_(?:infiniband|network)_[a-z_]+", render.RULE_FILE.read_text()))
    assert read, "the rules read no node-exporter metric?"
    node = Node("n", ib_ports=(("mlx5_0", 1),), interfaces=("eth0",))
    served = set(re.findall(r"^# TYPE (\S+)", node.render(), re.M))
    assert not read - served, f"rules read metrics node-exporter does not export: {sorted(read - served)}"


def sample(node: Node, name: str, **labels: str) -> float | None:
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in node.render().splitlines():
        if line.startswith(f"{name}{{{wanted}}} "):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_faults_move_the_series_as_the_kernel_would() -> None:
    node = Node("n", ib_ports=(("mlx5_0", 1), ("mlx5_1", 1)), interfaces=("eth0", "eth1"))
    port = {"device": "mlx5_0", "port": "1"}
    node.port_down("mlx5_0")
    node.port_down("mlx5_0")  # still down: no second down
    assert (
        sample(node, "node_infiniband_state_id", **port),
        sample(node, "node_infiniband_physical_state_id", **port),
    ) == (1, 2)
    assert sample(node, "node_infiniband_link_downed_total", **port) == 1
    node.flap("mlx5_0", times=3)
    assert sample(node, "node_infiniband_state_id", **port) == 4
    assert sample(node, "node_infiniband_link_downed_total", **port) == 4
    node.disable("mlx5_1")
    other = {"device": "mlx5_1", "port": "1"}
    assert sample(node, "node_infiniband_physical_state_id", **other) == 3
    assert sample(node, "node_infiniband_link_downed_total", **other) == 0
    node.errors("mlx5_0", symbol=40, receive=2)
    assert sample(node, "node_infiniband_symbol_error_total", **port) == 40
    assert sample(node, "node_infiniband_port_errors_received_total", **port) == 2
    # The PortCounters error counters clamp at their width's all ones and stay there; the data
    # counters (32 bits and more) are not among them.
    node.flap("mlx5_0", times=300)
    node.errors("mlx5_0", symbol=70_000)
    node.error_rate("mlx5_0", receive=1e9)
    assert sample(node, "node_infiniband_link_downed_total", **port) == 255
    assert sample(node, "node_infiniband_symbol_error_total", **port) == 65_535
    assert sample(node, "node_infiniband_port_errors_received_total", **port) == 65_535
    node.reboot()
    assert sample(node, "node_infiniband_symbol_error_total", **port) == 0
    assert sample(node, "node_infiniband_link_downed_total", **port) == 0

    node.carrier_down("eth0")
    assert sample(node, "node_network_carrier", device="eth0") == 0
    assert sample(node, "node_network_up", device="eth0") == 0
    assert sample(node, "node_network_carrier_down_changes_total", device="eth0") == 2
    assert sample(node, "node_network_carrier_changes_total", device="eth0") == 3
    node.admin_down("eth1")
    assert sample(node, "node_network_carrier", device="eth1") is None
    assert 'adminstate="down",broadcast="ff:ff:ff:ff:ff:ff",device="eth1"' in node.render()

    bare = Node("no-ib", ib_ports=(), interfaces=("eth0",))
    assert "node_infiniband_" not in bare.render()
    assert sample(bare, "node_scrape_collector_success", collector="infiniband") == 0


def test_promtool_parses_the_exposition(tmp_path: Path) -> None:
    promtool = require_binary("promtool", "prometheus")
    node = Node("n", ib_ports=(("mlx5_0", 1),), interfaces=("eth0",))
    node.port_down("mlx5_0")
    result = subprocess.run(
        [promtool, "check", "metrics"],
        input=node.render(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr + result.stdout
