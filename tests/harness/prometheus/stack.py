"""Re-export: the detection stack now lives in ``bot.demo.stack``."""

from bot.demo.assets import COLLECTORS_CSV
from bot.demo.stack import (
    NODES,
    TEST_TIMING,
    TEST_TOKEN,
    Delivery,
    DetectionStack,
    WebhookSink,
    start_stack,
    stop_stack,
)

__all__ = [
    "COLLECTORS_CSV",
    "NODES",
    "TEST_TIMING",
    "TEST_TOKEN",
    "Delivery",
    "DetectionStack",
    "WebhookSink",
    "start_stack",
    "stop_stack",
]
