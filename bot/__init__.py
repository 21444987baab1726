"""pitcrew — GPU died. Training didn't.

Turns GPU fault alerts from Alertmanager into safe, audited, reversible remediation of
Slurm-on-Kubernetes GPU nodes, and proves that the interrupted training job resumed.

Layers (enforced by import-linter: the ``[tool.importlinter]`` contracts in ``pyproject.toml``): ``bot.domain`` is pure;
``bot.engine`` runs plans against ports; ``bot.integrations`` and ``bot.store`` implement
those ports; ``bot.web`` and ``bot.cli`` are the outer shell.
"""

import logging

__version__ = "0.1.0"


def logger(module: str) -> logging.Logger:
    """The logger of a pitcrew module, named for the product: ``bot.engine.flow`` logs as
    ``pitcrew.engine.flow``, so one ``pitcrew`` logger level or filter covers all of it."""
    return logging.getLogger("pitcrew." + module.removeprefix("bot."))
