"""The Dockerfile read as data: stages and their instructions, for the tests that check it and run
its build commands without a Docker engine."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Instruction:
    keyword: str
    argument: str

    def exec_form(self) -> list[str]:
        """``["pitcrew"]`` of ``ENTRYPOINT ["pitcrew"]``."""
        value = json.loads(self.argument)
        assert isinstance(value, list)
        return [str(v) for v in value]


@dataclass
class Stage:
    base: str
    name: str
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction:
        found = self.all(keyword)
        assert found, f"stage {self.name} has no {keyword}"
        return found[-1]

    def labels(self) -> dict[str, str]:
        labels: dict[str, str] = {}
        for instruction in self.all("LABEL"):
            for word in shlex.split(instruction.argument):
                key, _, value = word.partition("=")
                labels[key] = value
        return labels

    def env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for instruction in self.all("ENV"):
            for word in shlex.split(instruction.argument):
                key, _, value = word.partition("=")
                env[key] = value
        return env


def parse(path: Path) -> list[Stage]:
    """Stages in order (the last is the default target). Comments dropped, continuations joined."""
    text = re.sub(
        r"\\\n", " ", "\n".join(ln for ln in path.read_text().splitlines() if not ln.lstrip().startswith("#"))
    )
    stages: list[Stage] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        keyword, _, argument = line.strip().partition(" ")
        keyword, argument = keyword.upper(), " ".join(argument.split())
        if keyword == "FROM":
            words = argument.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else str(len(stages))
            stages.append(Stage(base=words[0], name=name))
        elif keyword == "ARG" and not stages:
            continue
        else:
            stages[-1].instructions.append(Instruction(keyword, argument))
    return stages


def stage(stages: list[Stage], name: str) -> Stage:
    (found,) = [s for s in stages if s.name == name]
    return found


def lineage(stages: list[Stage], name: str) -> list[Stage]:
    """``name`` and the stages it is built FROM, base first."""
    chain = [stage(stages, name)]
    while chain[0].base in {s.name for s in stages}:
        chain.insert(0, stage(stages, chain[0].base))
    return chain
