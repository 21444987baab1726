"""The engine: intake of deliveries, planning, guards, approvals and the durable step executor.

It depends on ``bot.domain`` and on ports (``bot.engine.ports``, ``bot.store.base``);
never on a concrete integration, which the composition root (``bot.runtime``) injects.
"""
