"""Incident store: the port (``bot.store.base``) and its SQLite implementation.

The engine and the web layer depend on the port only; ``bot.store.sqlite`` is chosen by
the composition root. A Postgres implementation for several replicas can follow the same
port.
"""
