"""A node-exporter stand-in: the ``infiniband`` and ``netclass`` collectors' ``/metrics``, with link faults.

Serves what ``node_exporter --collector.disable-defaults --collector.infiniband --collector.netclass
--web.disable-exporter-metrics`` serves, byte for byte in node-exporter's layout (``exposition``), for
nodes whose InfiniBand/RoCE ports and Ethernet interfaces the tests break (``node``): a port down,
flapping, disabled by an administrator, a rising error rate, a reboot's counter reset, a lost
carrier. Sources for each behaviour: README.md.

In-process: ``with Standin(["gpu-001"]) as s: s.node("gpu-001").port_down("mlx5_0", 1)``.
"""

from proving_ground.nodeexporter.node import IbPort, Interface, Node
from proving_ground.nodeexporter.server import Standin, node_app

__all__ = ["IbPort", "Interface", "Node", "Standin", "node_app"]
