"""Re-export: ``bot.demo.dcgm.server``."""

from bot.demo.dcgm.server import ServerThread, Standin, node_app

__all__ = ["ServerThread", "Standin", "node_app"]
