"""Adapters to the far sides, one module per system (Slurm, Kubernetes, Slack, Prometheus, Grafana).

Each implements a port from ``bot.engine.ports`` and translates its library's failures into
``TransientError`` / ``PermanentError``. Nothing here decides what to do; the engine does.
"""
