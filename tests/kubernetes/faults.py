"""The emulator's fault injection and request log moved to ``bot.demo.kubernetes.faults``;
re-exported here for the tests (``test_rbac`` compares the logged requests with rbac.yaml)."""

from bot.demo.kubernetes.faults import Fault, FaultPlan, LoggedRequest

__all__ = ["Fault", "FaultPlan", "LoggedRequest"]
