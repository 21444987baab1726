"""A pool's own command for joining a lent node to the jobs' partition, instead of relabelling it.

Some sites do not join a node to the Slurm partition by a NodeSet's label: a script registers it
(``scontrol update``, a dynamic node's ``slurmd -Z``, a provider's API). A Kubernetes pool may
then give ``join_command`` (and ``leave_command``, its undo) as an argument vector: run without a
shell, its words may hold the placeholders below and nothing else, filled in word by word, so a
node name can never become an option or a second command. Pure: the configuration checks the
words, the take fills them; running them is the integration's.
"""

from __future__ import annotations

from collections.abc import Sequence
from string import Formatter

#: What a command's words may name: the lent node, the incident, the pool.
PLACEHOLDERS = ("node", "incident", "pool")


def problems(argv: Sequence[str]) -> list[str]:
    """What is wrong with a command's words (an unknown or malformed placeholder)."""
    found = []
    for word in argv:
        try:
            fields = [name for _, name, spec, conv in Formatter().parse(word) if name is not None]
        except ValueError as exc:
            found.append(f"{word!r}: {exc}")
            continue
        for name in fields:
            if name not in PLACEHOLDERS:
                known = ", ".join(f"{{{p}}}" for p in PLACEHOLDERS)
                found.append(f"{word!r}: unknown placeholder {{{name}}} (known: {known})")
    return found


def fill(argv: Sequence[str], *, node: str, incident: str, pool: str) -> list[str]:
    """The words with their placeholders filled in, one word each (no shell ever splits them)."""
    return [word.format(node=node, incident=incident, pool=pool) for word in argv]
