"""The simulated far side, for tests: re-exports of ``bot.demo.simulator`` (world, cluster, serve).

``bot.runtime.build_app`` refuses its ports unless the caller passes ``allow_simulated=True``.
"""
