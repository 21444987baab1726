"""The proving ground: pitcrew's far sides on one machine, for ``scripts/demo`` and for the tests.

It lives in the source checkout beside ``rules/`` and ``alertmanager/`` (which it loads), never in
the wheel or the image, and drives pitcrew from outside through its CLI and real adapters.

Real Prometheus and Alertmanager (``prometheus``, ``stack``), a real Slurm cluster on loopback
(``slurm``), the dcgm-exporter stand-in (``dcgm``), the checkpointing training job
(``train_job``), pitcrew as a subprocess (``pitcrew``), the Slack stand-in (``slack``: Web API,
signed clicks, Socket Mode; ``slackside`` puts it behind pitcrew's real Slack adapter), the
Kubernetes API emulator (``kubernetes``; ``kubeside`` puts it behind pitcrew's real Kubernetes
adapter), and the demo that runs them together (``__main__``: the command; ``run``: one scenario;
``ground``: starting and stopping the far sides; ``story``: following an incident and the
summary; ``scenarios``; ``timeline``; ``farside``: the seam where the cluster and notifier far
sides plug in). The simulated far side of the engine tests is the tests' own (``tests/simulator``).

An import-linter contract keeps ``bot`` (the product) from importing any of it.
"""
