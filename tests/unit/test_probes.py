"""The ``check-config --live`` framework (``bot.probes``), apart from any far side:

- an adapter serving several ports is probed once, its roles listed together;
- adapters that are not ``Probeable`` are listed as having nothing to reach, never as failed;
- a probe that hangs past the deadline or raises is a failed far side with its role named, and
  the other far sides are still answered;
- the exit lines name each failed system and what it misses.

The adapters here are stand-ins for the framework's sake only: the real probes are exercised in
tests/integration/test_check_config_live.py against real Slurm and Prometheus.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from bot.config import load_config
from bot.engine.context import Ports
from bot.engine.ports import Probe
from bot.integrations.journal import DryRunJournal, LogNotifier
from bot.probes import Checked, far_sides, missing, probe_far_sides, render, unable


class Answers:
    def __init__(self, probe: Probe) -> None:
        self.answer = probe

    async def probe(self) -> Probe:
        return self.answer


class Hangs:
    async def probe(self) -> Probe:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")


class Breaks:
    async def probe(self) -> Probe:
        raise RuntimeError("adapter bug")


async def test_each_adapter_once_and_failures_named(tmp_path: Path) -> None:
    journal = DryRunJournal(tmp_path / "journal.jsonl")
    prometheus = Answers(Probe("prometheus", False, "down", missing=("Prometheus at http://p:9090",)))
    ports = Ports(scheduler=journal, cluster=journal, notifier=LogNotifier(journal), query=prometheus)  # type: ignore[arg-type]
    sides = far_sides(
        ports,
        extra=[
            ("grafana", Hangs()),
            ("slack", Breaks()),
            ("kubernetes", Answers(Probe("kubernetes", True, "ok"))),
        ],
    )
    assert [s.roles for s in sides] == [
        ("scheduler", "cluster"),
        ("notifier",),
        ("query",),
        ("grafana",),
        ("slack",),
        ("kubernetes",),
    ]
    checked = await probe_far_sides(sides, within=0.2)
    assert [(c.probe.system, c.probe.ok, c.reached) for c in checked] == [
        ("journal", True, False),
        ("log", True, False),
        ("prometheus", False, True),
        ("grafana", False, True),
        ("slack", False, True),
        ("kubernetes", True, True),
    ]
    lines = render(checked)
    assert lines[0].split()[:3] == ["-", "journal", "(scheduler/cluster)"]
    assert "no answer within 0.2s" in lines[3]
    assert "RuntimeError: adapter bug" in lines[4]
    assert lines[5].split()[0] == "ok"
    assert missing(checked) == [
        "prometheus: Prometheus at http://p:9090",
        "grafana: grafana answering in time",
        "slack: slack",
    ]
    assert not (tmp_path / "journal.jsonl").exists(), "probing the journal must not write it"


def test_a_scheduler_that_cannot_requeue_is_named_for_slinky_too(tmp_path: Path) -> None:
    """slurm-operator's DRAIN lets jobs run as pitcrew's does: the drain step requeues them after the
    grace period, so a scheduler that cannot requeue is named with Slinky's mapping as well, and
    whatever the playbook's ``slurm_action`` (the operator always drains)."""
    playbook = {
        "steps": ["slurm_down", "cordon", "drain", "close"],
        "slurm_action": "down",
        "description": "x",
    }
    refused = Checked(("scheduler",), Probe("slurm", True, "ok", unable=(("requeue", "v0.0.38"),)), True)
    for mapping, named in (("identity", False), ("slinky", True)):
        config = load_config(mode="auto", slurm={"node_mapping": mapping}, playbooks={"take-out": playbook})
        [line] = unable(config, [refused])  # the shipped playbooks DRAIN and need it either way
        assert ("take-out" in line) is named, (mapping, line)
        assert "v0.0.38" in line


def test_a_scheduler_that_cannot_requeue_is_named_for_a_hung_job_playbook_in_use() -> None:
    """requeue_job always requeues: ``requeue-hung-job`` is named once a site gives it to job-hung,
    and not while it is only shipped."""
    refused = Checked(("scheduler",), Probe("slurm", True, "ok", unable=(("requeue", "v0.0.42"),)), True)
    shipped = load_config(mode="auto")
    assert not [line for line in unable(shipped, [refused]) if "requeue-hung-job" in line]
    opted = load_config(mode="auto", catalog={"overrides": {"job-hung": {"playbook": "requeue-hung-job"}}})
    [line] = [line for line in unable(opted, [refused]) if "requeue-hung-job" in line]
    assert "for a hung job: v0.0.42" in line
