"""Adapters to the far sides, one module per system (Slurm, Kubernetes, Slack, Prometheus, Grafana).

Each implements a port from ``bot.engine.ports`` and translates its library's failures into
``TransientError`` / ``PermanentError``. Nothing here decides what to do; the engine does.
Besides the real systems: the write-only dry-run journal (``journal``); Slurm-only sites have
no cluster port at all (the engine skips or hands over the Kubernetes steps). No simulator of a far side lives here: those are test
tools (``tests/simulator``).
"""
