"""Re-export: ``bot.demo.dcgm.node``."""

from bot.demo.dcgm.node import FAULTS, Gpu, Node

__all__ = ["FAULTS", "Gpu", "Node"]
