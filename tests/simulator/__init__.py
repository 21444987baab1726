"""The simulated far side: Slurm, Kubernetes and the notifier modelled over a journal, for tests.

``world`` holds the state model (inventory, simulated requeue and replacement, latency),
``cluster`` the Kubernetes and notifier halves, ``serve`` the test-only entry point that
runs pitcrew's service in front of them. Every port object here says
``far_side = "simulator"``, and ``bot.runtime.build_app`` refuses such ports unless the
caller passes ``allow_simulated=True``: pitcrew itself never imports this package (an
import-linter contract), so a simulator can never be what a real deployment talks to.
"""
