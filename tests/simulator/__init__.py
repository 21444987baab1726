"""The simulated far side: Slurm, Kubernetes and the notifier modelled over a journal.

``world`` holds the state model (inventory, simulated requeue and replacement, latency),
``cluster`` the Kubernetes and notifier halves, ``serve`` the entry point that runs pitcrew's
service in front of them (``python -m tests.simulator.serve``). Every port object here says
``far_side = "simulator"``, and ``bot.runtime.build_app`` refuses such ports unless the
caller passes ``allow_simulated=True``: only the demo and the tests do, and the service itself
never imports ``proving_ground`` (an import-linter contract), so a simulator can never be what a real
deployment talks to.
"""
