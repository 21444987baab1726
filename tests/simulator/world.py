"""Re-export: the simulated world now lives in ``bot.demo.simulator.world``."""

from bot.demo.simulator.world import Journal, SimulatedWorld

__all__ = ["Journal", "SimulatedWorld"]
