"""pitcrew — GPU died. Training didn't.

Turns GPU fault alerts from Alertmanager into safe, audited, reversible remediation of
Slurm-on-Kubernetes GPU nodes, and proves that the interrupted training job resumed.

Layers (enforced by import-linter, see ``.importlinter``): ``bot.domain`` is pure;
``bot.engine`` runs plans against ports; ``bot.integrations`` and ``bot.store`` implement
those ports; ``bot.web`` and ``bot.cli`` are the outer shell.
"""

__version__ = "0.1.0"
