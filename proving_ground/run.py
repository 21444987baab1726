"""``scripts/demo``: one scenario on the proving ground, told as it happens, then a summary.

Owns the story: start the proving ground, submit the checkpointing job and wait for its first
checkpoint, inject the scenario's fault on the node running it, follow the incident through
pitcrew's own read API, Slurm and Prometheus, and end with the time to recovery by stage,
pitcrew's own share of it, the incident thread as text, the GPU-hours lost and where the logs
are. Everything it started is stopped at the end, on Ctrl-C and on SIGTERM (``scripts/demo
--stop`` sends it), unless ``--keep`` (then it stays up until one of those).
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from proving_ground.farside import FarSide, far_side
from proving_ground.ground import ProvingGround, preflight
from proving_ground.proc import DemoError
from proving_ground.scenarios import Scenario
from proving_ground.story import Story, summary_lines
from proving_ground.timeline import Timeline

#: Where runs keep their directories, and the pointer to the newest one (``--stop`` reads it).
RUNS = Path(tempfile.gettempdir()) / "pitcrew-demo"
CURRENT = RUNS / "current.json"


@dataclass(frozen=True, slots=True)
class DemoOptions:
    scenario: Scenario
    keep: bool = False
    interactive: bool = False
    json_summary: Path | None = None
    replace_delay: float = 5.0
    timeout: float = 240.0
    rich: bool | None = None
    ports: tuple[tuple[str, int], ...] = ()
    slurm: str | None = None  # the Slurm version (proving_ground.slurm_root.VERSIONS)
    store: str = "sqlite"  # pitcrew's store: "sqlite" or "postgres" (a throwaway cluster)


class Stopped(Exception):
    """SIGTERM (``scripts/demo --stop``): stop everything, as Ctrl-C does."""


def _on_term(signum: int, frame: FrameType | None) -> None:
    raise Stopped


def run(options: DemoOptions, timeline: Timeline | None = None) -> int:
    """The whole demo; the exit status (0: the scenario ended as it should)."""
    tl = timeline or Timeline(rich=options.rich)
    problems = preflight(dict(options.ports), slurm=options.slurm, store=options.store)
    if problems:
        tl.say("scripts/demo cannot start:")
        for problem in problems:
            tl.say(f"  - {problem}")
        return 2
    RUNS.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=f"{options.scenario.name}-", dir=RUNS))
    workdir.chmod(0o755)  # munged wants its socket's directories searchable by all; slurmrestd reads
    side: FarSide = far_side()
    ground = ProvingGround(
        options.scenario,
        workdir,
        side,
        replace_delay=options.replace_delay,
        ports=dict(options.ports),
        slurm=options.slurm,
        store=options.store,
    )
    previous = signal.signal(signal.SIGTERM, _on_term)
    status = 1
    try:
        tl.say(f"scripts/demo — {options.scenario.title}")
        tl.say(f"  run directory {workdir}")
        began = time.monotonic()
        steps = ground.steps()
        what = next(steps, None)
        while what is not None:
            with tl.waiting(what):
                following = next(steps, None)  # runs the step ``what`` names
            tl.say(f"  up: {what}")
            what = following
        tl.say(f"  proving ground up in {time.monotonic() - began:.1f}s")
        ground.write_state(CURRENT, scenario=options.scenario.name, keep=options.keep, **side.state())
        story = Story(ground, tl, options)
        status = story.play()
        report = story.summary()
        for line in summary_lines(report, ground):
            tl.say(line)
        refused = ground.far_side.refused()
        for line in refused:
            tl.say(f"  refused: {line}")
        status = status or (1 if refused else 0)
        report["refused"] = refused
        report["exit_status"] = status
        if options.json_summary is not None:
            _write_json(options.json_summary, report | {"state": str(CURRENT)})
        if options.keep:
            _keep(ground, tl, story.incident_id)
    except (KeyboardInterrupt, Stopped):
        tl.say("\n  interrupted: stopping everything")
        status = 130
    except DemoError as exc:
        tl.say(f"scripts/demo failed: {exc}")
        tl.say(f"  logs: {workdir}")
        status = 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the cleanup short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            survivors = ground.stop()
            if survivors:
                tl.say(f"  {survivors}")
                status = status or 1
            else:
                tl.say("  stopped: no process of the demo is left")
            if CURRENT.exists() and json.loads(CURRENT.read_text()).get("pid") == os.getpid():
                CURRENT.unlink()
        finally:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGTERM, previous)
    return status


def _keep(ground: ProvingGround, tl: Timeline, incident_id: str | None) -> None:
    """Stay up for a look around, until Ctrl-C or ``scripts/demo --stop``."""
    assert ground.pitcrew is not None
    urls = ground.urls()
    config = ground.pitcrew.config_path
    tl.say("")
    tl.say("The proving ground stays up (--keep). Look around:")
    tl.say(f"  Prometheus    {urls.get('prometheus')}/alerts")
    tl.say(f"  Alertmanager  {urls.get('alertmanager')}")
    tl.say(f"  pitcrew       {urls.get('pitcrew')}  (read token: {ground.pitcrew.workdir / 'read.token'})")
    tl.say(f"  incidents     pitcrew incidents -c {config}")
    tl.say(f"                pitcrew incidents show ID -c {config}")
    clients = f"{ground.slurm.bin_dir}/" if ground.slurm.bin_dir else ""
    tl.say(f"  Slurm {ground.slurm.version}   SLURM_CONF={ground.slurm.conf} {clients}sinfo; {clients}squeue")
    for line in ground.far_side.where(incident_id):
        tl.say(f"  {line}")
    tl.say(f"Stop it with Ctrl-C here, or from anywhere: scripts/demo --stop (kill -TERM {os.getpid()})")
    tl.say("  (it also stops once the process that started it is gone)")
    parent = os.getppid()
    try:
        # A demo whose starter died (a killed test run, a closed terminal) must not keep its
        # servers running with no one left to stop them.
        while os.getppid() == parent:
            time.sleep(1)
        tl.say(f"\n  the process that started the demo (pid {parent}) is gone: stopping everything")
    except (KeyboardInterrupt, Stopped):
        tl.say("\n  stopping everything")


def stop_running() -> int:
    """``scripts/demo --stop``: ask the demo that runs (``--keep``) to stop everything, and wait."""
    try:
        state = json.loads(CURRENT.read_text())
    except (OSError, ValueError):
        print("no scripts/demo is running")
        return 1
    pid = int(state["pid"])
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        CURRENT.unlink(missing_ok=True)
        print(f"the demo (pid {pid}) is gone already")
        return 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            print(f"stopped the demo (pid {pid}); its files stay in {state['workdir']}")
            return 0
        time.sleep(0.2)
    print(f"the demo (pid {pid}) did not stop within 60 s")
    return 1


def click_running(button: str, incident_id: str, user: str) -> int:
    """``scripts/demo --click approve ID``: a person clicks a button of the running demo's Slack
    stand-in, which sends pitcrew the signed request Slack would send."""
    try:
        state = json.loads(CURRENT.read_text())
        url, channel = str(state["slack_click_url"]), str(state["slack_channel"])
    except (OSError, ValueError, KeyError):
        print(
            "no scripts/demo with a Slack stand-in is running (start one: scripts/demo --scenario approve --interactive)"
        )
        return 1
    body = json.dumps(
        {"channel": channel, "button": button.capitalize(), "value": incident_id, "user": user}
    ).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        print(f"the click did not happen: {json.loads(exc.read() or b'{}').get('error', exc.reason)}")
        return 1
    except urllib.error.URLError as exc:
        print(f"the demo's Slack stand-in does not answer at {url}: {exc.reason}")
        return 1
    print(f"{user} clicked {button.capitalize()} on {incident_id}; pitcrew answered HTTP {answer['status']}")
    if answer.get("answer"):
        print(f"  and told {user} (only they see it): {answer['answer']}")
    return 0 if answer["status"] == 200 else 1


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    tmp.replace(path)
