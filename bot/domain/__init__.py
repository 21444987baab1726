"""Pure decision core: alert → fault → incident → plan.

Nothing here performs I/O or reads a clock: ``now`` is always a parameter. import-linter
forbids aiohttp, slack, kubernetes, sqlite and the other I/O libraries in this package.
"""
