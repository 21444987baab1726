"""``python -m proving_ground`` (what ``scripts/demo`` runs): watch pitcrew heal a GPU fault here.

The proving ground lives in the source checkout, beside ``rules/`` and ``alertmanager/`` which it
loads; the installed ``pitcrew`` package carries none of it. It drives pitcrew from outside: the
real ``pitcrew serve`` as a subprocess, with its real Slurm, Kubernetes and Slack adapters pointed
at the servers started here.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from proving_ground.run import DemoOptions, click_running, run, stop_running
from proving_ground.scenarios import SCENARIOS
from proving_ground.slurm_root import VERSIONS

BUTTONS = ("approve", "reject", "rollback")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="scripts/demo",
        description="watch pitcrew heal a GPU fault on a proving ground on this machine (root)",
    )
    p.add_argument(
        "--scenario",
        choices=list(SCENARIOS),
        default="xid79",
        help="xid79 (default): replace a node under a training job; ecc: reset a GPU; approve: wait for a "
        "human's approval; storm: 20 nodes at once, the breaker holds; app-xid: XID 13, notify only",
    )
    p.add_argument(
        "--slurm",
        choices=VERSIONS,
        default=None,
        help="Slurm to run: 22.05 (Debian 12's), 24.11 (from the Debian 13 root scripts/setup makes) or "
        '26.05 (from the Debian unstable root it makes with PITCREW_SLURM_ROOTS="24.11 26.05"); '
        "default $PROVING_GROUND_SLURM, else 22.05",
    )
    p.add_argument(
        "--store",
        choices=("sqlite", "postgres"),
        default="sqlite",
        help="pitcrew's store: sqlite (default, a file) or postgres (a throwaway PostgreSQL cluster "
        "started and removed by the demo; Debian's postgresql package)",
    )
    p.add_argument("--keep", action="store_true", help="leave everything running to look around")
    p.add_argument("--interactive", action="store_true", help="approve scenario: wait for your own approval")
    p.add_argument("--stop", action="store_true", help="stop a demo left running with --keep")
    p.add_argument(
        "--click",
        nargs=2,
        metavar=("BUTTON", "ID"),
        help="click a button (approve, reject, rollback) of incident ID in the running demo's Slack",
    )
    p.add_argument("--user", default="U0ALICE", help="who clicks (U0ALICE approves; U0MALLORY may not)")
    p.add_argument(
        "--replace-delay", type=float, default=5.0, help="seconds until a replaced node's successor joins"
    )
    p.add_argument(
        "--timeout", type=float, default=240.0, help="seconds the scenario may take after the fault"
    )
    p.add_argument("--json-summary", metavar="PATH", help="write the outcome, milestones and stages as JSON")
    p.add_argument("--plain", action="store_true", help="plain lines even on a terminal")
    for what in ("pitcrew", "prometheus", "alertmanager"):
        p.add_argument(
            f"--{what}-port",
            type=int,
            default=0,
            help=f"fixed loopback port for {what} (default: a free one)",
        )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.stop:
        return stop_running()
    if args.click:
        button, incident_id = args.click
        if button not in BUTTONS:
            print(f"scripts/demo --click: the buttons are approve, reject and rollback, not {button!r}")
            return 2
        return click_running(button, incident_id, args.user)
    ports = tuple(
        (what, port)
        for what, port in (
            ("pitcrew", args.pitcrew_port),
            ("prometheus", args.prometheus_port),
            ("alertmanager", args.alertmanager_port),
        )
        if port
    )
    options = DemoOptions(
        scenario=SCENARIOS[args.scenario],
        keep=args.keep,
        interactive=args.interactive,
        json_summary=Path(args.json_summary) if args.json_summary else None,
        replace_delay=args.replace_delay,
        timeout=args.timeout,
        rich=False if args.plain else None,
        ports=ports,
        slurm=args.slurm,
        store=args.store,
    )
    return run(options)


if __name__ == "__main__":
    sys.exit(main())
