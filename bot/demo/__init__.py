"""The proving ground, packaged for ``pitcrew demo`` (the ``pitcrew[demo]`` extra) and for the tests.

Real Prometheus and Alertmanager (``prometheus``, ``stack``), a real Slurm cluster on loopback
(``slurm``), the dcgm-exporter stand-in (``dcgm``), the checkpointing training job
(``train_job``), pitcrew as a subprocess (``pitcrew``), the Slack stand-in (``slack``: Web API,
signed clicks, Socket Mode; ``slackside`` puts it behind pitcrew's real Slack adapter), the
Kubernetes API emulator (``kubernetes``; ``kubeside`` puts it behind pitcrew's real Kubernetes
adapter), the simulated far side the engine tests run pitcrew against (``simulator``), and the
demo that runs them together (``run``: the command; ``ground``: starting and stopping the far
sides; ``story``: following an incident and the summary; ``scenarios``; ``timeline``;
``farside``: the seam where the cluster and notifier far sides plug in).

Only ``bot.cli`` imports this package (an import-linter contract): the service never runs on
a proving ground it could mistake for a real cluster.
"""
