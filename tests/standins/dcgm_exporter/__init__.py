"""Re-export: the dcgm-exporter stand-in now lives in ``bot.demo.dcgm``."""

from bot.demo.dcgm import (
    DEFAULT_COLLECTORS,
    FAULTS,
    FIELDS,
    Field,
    Node,
    ServerThread,
    Standin,
    load_collectors,
    node_app,
)

__all__ = [
    "DEFAULT_COLLECTORS",
    "FAULTS",
    "FIELDS",
    "Field",
    "Node",
    "ServerThread",
    "Standin",
    "load_collectors",
    "node_app",
]
