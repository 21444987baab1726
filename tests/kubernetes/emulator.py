"""The Kubernetes API emulator moved to ``bot.demo.kubernetes.emulator`` (``pitcrew demo`` runs it);
re-exported here for the tests."""

from bot.demo.kubernetes.emulator import FIXTURES, KubeEmulator, load_fixture, now_iso

__all__ = ["FIXTURES", "KubeEmulator", "load_fixture", "now_iso"]
