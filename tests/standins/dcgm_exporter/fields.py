"""Re-export: ``bot.demo.dcgm.fields``."""

from bot.demo.dcgm.fields import (
    DEFAULT_COLLECTORS,
    DGX_H100_BUS,
    DRIVER_LABEL,
    FIELDS,
    HEALTH_WATCHES,
    XID_TEXT,
    Field,
    load_collectors,
)

__all__ = [
    "DEFAULT_COLLECTORS",
    "DGX_H100_BUS",
    "DRIVER_LABEL",
    "FIELDS",
    "HEALTH_WATCHES",
    "XID_TEXT",
    "Field",
    "load_collectors",
]
