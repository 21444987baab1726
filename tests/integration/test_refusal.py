"""pitcrew refuses, before it starts, to act on real nodes through ports that only write a journal.

Cases: ``pitcrew check-config`` and ``pitcrew serve`` refuse a real Slurm scheduler with the
default (journal) cluster in auto mode, in approve mode and through a ``playbook_modes``
override — exit 1, one stderr line per problem naming ``integrations.cluster`` and the real
alternatives, and ``serve`` starts nothing (no store, no journal, no port); the same
configuration in observe mode, and ``integrations.cluster: none`` with Slurm in auto mode,
are accepted. ``port_problems`` as a table: one line per journalled port, grouping the
playbooks and naming the keys that set their mode; playbooks that change nothing and
observe-mode playbooks are never a problem; ``none`` needs identity node mapping.
``build_app`` raises the same refusal, and refuses simulated ports unless a test allows them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from aiohttp import web

from bot.cli import main
from bot.config import ConfigError, load_config
from bot.engine.steps import REGISTRY
from bot.runtime import build_app, build_ports
from bot.safety import port_problems
from proving_ground.assets import REPO
from proving_ground.proc import free_port
from tests.simulator.serve import WorldFile, simulated_ports

SLURM: dict[str, Any] = {"integrations": {"scheduler": "slurm"}}
APPROVERS: dict[str, Any] = {"approvals": {"approvers": ["alice"]}}
DANGEROUS: dict[str, dict[str, Any]] = {
    "auto": {"mode": "auto", **SLURM},
    "approve": {"mode": "approve", **APPROVERS, **SLURM},
    "playbook_modes override": {"playbook_modes": {"replace-node": "auto"}, **SLURM},
}


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PITCREW_STORE__PATH", str(tmp_path / "state" / "pitcrew.db"))
    for name in ("PITCREW_MODE", "PITCREW_SERVER__LISTEN"):
        monkeypatch.delenv(name, raising=False)


def write(tmp_path: Path, settings: dict[str, Any]) -> Path:
    path = tmp_path / "pitcrew.yaml"
    path.write_text(yaml.safe_dump(settings))
    return path


@pytest.mark.parametrize("case", sorted(DANGEROUS))
def test_check_config_refuses_real_slurm_with_a_journalled_cluster(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check-config", "--config", str(write(tmp_path, DANGEROUS[case]))]) == 1
    out, err = capsys.readouterr()
    assert "configuration OK" not in out
    [line] = err.splitlines()
    assert line.startswith("pitcrew: refusing this configuration: mode ")
    assert "replace-node (cordon, drain, replace, wait_ready)" in line
    assert "through integrations.cluster: journal" in line
    assert "while integrations.scheduler: slurm acts on real nodes" in line
    assert "set integrations.cluster: none" in line
    if case == "playbook_modes override":
        assert "mode auto (playbook_modes.replace-node) runs replace-node" in line
        assert line.endswith("or playbook_modes.replace-node: observe")
        assert "reboot-node" not in line  # observe by default: not a problem
    else:
        assert (
            f"mode {case} runs checkpoint-reset-gpu (cordon, drain, reset_gpu, wait_ready), cordon-and-ask "
            "(cordon), follow-slurm (cordon), isolate-node (cordon), reboot-node" in line
        )
        assert line.endswith("or mode: observe")


@pytest.mark.parametrize("case", sorted(DANGEROUS))
def test_serve_refuses_it_without_starting_anything(case: str, tmp_path: Path) -> None:
    port = free_port()
    settings = {**DANGEROUS[case], "server": {"listen": f"127.0.0.1:{port}"}}
    done = subprocess.run(
        [sys.executable, "-m", "bot.cli", "serve", "--config", str(write(tmp_path, settings))],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=30,  # a server that started would never return: the test fails here
    )
    assert done.returncode == 1, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("pitcrew: refusing this configuration: ")
    assert "integrations.cluster: journal" in line and "integrations.cluster: none" in line
    assert not (tmp_path / "state").exists()  # no store, no journal


def test_observe_mode_may_use_the_journal_with_real_slurm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check-config", "--config", str(write(tmp_path, {"mode": "observe", **SLURM}))]) == 0
    assert "scheduler slurm; cluster journal; notifier log" in capsys.readouterr().out


def test_slurm_only_sites_in_auto_mode_are_accepted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = {"mode": "auto", "integrations": {"scheduler": "slurm", "cluster": "none"}}
    assert main(["check-config", "--config", str(write(tmp_path, settings))]) == 0
    out, err = capsys.readouterr()
    assert "configuration OK" in out and "cluster none" in out and not err


def problems(**settings: Any) -> list[str]:
    return port_problems(load_config(None, **settings))


def test_all_journal_in_auto_mode_is_one_line_per_port() -> None:
    scheduler, cluster = problems(mode="auto")
    assert scheduler.startswith(
        "mode auto runs checkpoint-reset-gpu (checkpoint, slurm_down, slurm_resume), cordon-and-ask "
        "(slurm_down), follow-slurm (slurm_down, slurm_returned), isolate-node (slurm_down), reboot-node "
        "(slurm_down, "
    )
    assert "through integrations.scheduler: journal, a dry-run journal that changes nothing;" in scheduler
    assert "set integrations.scheduler: slurm or mode: observe" in scheduler
    assert "through integrations.cluster: journal, a dry-run journal that changes nothing;" in cluster
    assert "acts on real nodes" not in scheduler + cluster  # nothing real is configured


def test_modes_are_grouped_and_each_names_its_key() -> None:
    [line] = problems(
        mode="approve",
        approvals={"approvers": ["alice"]},
        playbook_modes={
            "replace-node": "auto",
            "checkpoint-reset-gpu": "observe",
            "reset-gpu": "observe",
            "reboot-node": "observe",
            "reboot-then-replace": "observe",
        },
        integrations={"scheduler": "slurm"},
    )
    assert line.startswith(
        "mode approve runs cordon-and-ask (cordon), follow-slurm (cordon), isolate-node (cordon) and mode auto "
        "(playbook_modes.replace-node) runs "
        "replace-node (cordon, drain, replace, wait_ready) through integrations.cluster: journal"
    )
    assert line.endswith("or mode: observe, playbook_modes.replace-node: observe")


@pytest.mark.parametrize(
    "settings",
    [
        {},  # observe by default
        {"mode": "observe", **SLURM},
        {"mode": "auto", "integrations": {"scheduler": "slurm", "cluster": "none"}},
        {  # every playbook that changes something is held in observe mode
            "mode": "auto",
            "playbook_modes": {
                p: "observe"
                for p in (
                    "checkpoint-reset-gpu",
                    "cordon-and-ask",
                    "follow-slurm",
                    "isolate-node",
                    "reset-gpu",
                    "reboot-node",
                    "reboot-then-replace",
                    "replace-node",
                    "requeue-hung-job",
                )
            },
        },
        {  # a user playbook that only tells humans may run in auto mode on the journal
            "playbook_modes": {"page-oncall": "auto"},
            "playbooks": {"page-oncall": {"steps": ["notify", "close"]}},
        },
    ],
)
def test_configurations_that_cannot_act_through_the_journal_pass(settings: dict[str, Any]) -> None:
    assert problems(**settings) == []


def test_a_user_playbook_acting_through_the_journal_is_caught() -> None:
    [line] = problems(
        playbook_modes={"resume-only": "auto"},
        playbooks={"resume-only": {"steps": ["notify", "slurm_down", "slurm_resume", "close"]}},
        integrations={"cluster": "none"},
    )
    assert line.startswith(
        "mode auto (playbook_modes.resume-only) runs resume-only (slurm_down, slurm_resume)"
    )
    assert "integrations.scheduler: journal" in line


def test_no_cluster_needs_identity_node_mapping() -> None:
    [line] = problems(
        integrations={"cluster": "none"}, slurm={"node_mapping": "label", "node_mapping_key": "slurm/node"}
    )
    assert line.startswith("slurm.node_mapping: label reads Kubernetes nodes, but integrations.cluster: none")


def test_the_refusal_reads_each_step_s_port_from_the_registry() -> None:
    mutating = {name: step.port for name, step in REGISTRY.items() if step.mutating}
    assert set(mutating.values()) == {"scheduler", "cluster"}
    # A site playbook whose only mutating step acts through Slurm needs no cluster.
    slurm_only = {"playbooks": {"replace-node": {"steps": ["notify", "slurm_down", "close"]}}}
    [cluster_line] = problems(mode="auto", **SLURM, **slurm_only)
    assert "integrations.cluster: journal" in cluster_line and "replace-node" not in cluster_line
    assert "reboot-node (cordon, drain, reboot, wait_ready)" in cluster_line


def test_build_app_raises_the_refusal() -> None:
    with pytest.raises(ConfigError, match=r"integrations\.cluster: journal"):
        build_app(load_config(None, mode="auto", **SLURM))


def test_build_ports_puts_the_journal_only_where_configured(tmp_path: Path) -> None:
    journal = build_ports(load_config(None))
    assert [getattr(p, "far_side", None) for p in (journal.scheduler, journal.cluster, journal.notifier)] == [
        "journal",
        "journal",
        "log",
    ]
    assert cast(object, journal.scheduler) is journal.cluster  # one journal, in call order
    slurm_only = build_ports(
        load_config(None, mode="auto", integrations={"scheduler": "slurm", "cluster": "none"})
    )
    assert getattr(slurm_only.scheduler, "far_side", None) is None  # the real Slurm adapter
    assert slurm_only.cluster is None  # no cluster: the engine skips or hands over the Kubernetes steps


def test_build_app_refuses_simulated_ports_unless_a_test_allows_them(tmp_path: Path) -> None:
    config = load_config(None)
    ports = simulated_ports(config, WorldFile(journal=tmp_path / "simulated.jsonl"))
    with pytest.raises(ConfigError, match=r"simulated scheduler, cluster, notifier \(tests/simulator\)"):
        build_app(config, ports=ports)
    assert isinstance(build_app(config, ports=ports, allow_simulated=True), web.Application)
    real_slurm = load_config(None, integrations={"scheduler": "slurm"})
    with pytest.raises(ConfigError, match=r"simulated cluster, notifier \("):
        build_app(real_slurm, ports=simulated_ports(real_slurm, WorldFile(journal=tmp_path / "s.jsonl")))
