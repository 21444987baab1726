"""Re-export: Prometheus and Alertmanager as servers now live in ``bot.demo.prometheus``."""

from bot.demo.assets import REPO, SHIPPED_ALERTMANAGER
from bot.demo.prometheus import (
    Alertmanager,
    Process,
    Prometheus,
    Timing,
    alertmanager_config,
    duration,
    http_json,
    prometheus_config,
)

__all__ = [
    "REPO",
    "SHIPPED_ALERTMANAGER",
    "Alertmanager",
    "Process",
    "Prometheus",
    "Timing",
    "alertmanager_config",
    "duration",
    "http_json",
    "prometheus_config",
]
