"""Re-export: the simulated cluster and notifier now live in ``bot.demo.simulator.cluster``."""

from bot.demo.simulator.cluster import SimulatedCluster, SimulatedNotifier

__all__ = ["SimulatedCluster", "SimulatedNotifier"]
