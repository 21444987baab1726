"""``pitcrew`` command line: serve, check-config, plan (dry run), catalog, incidents, audit export, commands.

Commands that change state (approve, reject, rollback, pause, resume, breaker reset) go
through the running server's command API so the engine acts on them at once and the
audit log names who asked.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bot import __version__
from bot.config import Config, ConfigError, load_config, read_secret
from bot.config_sections import StoreSettings
from bot.domain.durations import format_duration
from bot.domain.trust import IncidentFacts, ledger, offenders
from bot.report import (
    catalog_rows,
    dry_run,
    offender_rows,
    render_detail,
    render_incidents,
    render_offenders,
    render_plans,
    render_trust,
    trust_facts,
    trust_rows,
)
from bot.safety import port_problems
from bot.store.base import LIST_MAX, PAGE_DEFAULT, PAGE_MAX, BadCursor, Lease, Store, StoreRefused
from bot.store.factory import build_store
from bot.store.factory import describe as describe_store


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        return _reader_gone()
    except OSError as exc:  # the output cannot be written (`> /dev/full`), or a file cannot be read
        return _cannot_write(exc)
    except ConfigError as exc:
        print(f"pitcrew: invalid configuration:\n{exc}", file=sys.stderr)
        return 1
    except StoreRefused as exc:  # at start or a read command's open: a restart will not help
        print(f"pitcrew: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _main(argv: Sequence[str] | None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit:  # --help, --version, a usage error: their output must be written too
        sys.stdout.flush()
        raise
    if not getattr(args, "handler", None):
        parser.print_help()
        sys.stdout.flush()
        return 2
    result: int = args.handler(args)
    sys.stdout.flush()  # a reader that went away, a full disk, show themselves here, not at exit
    return result


def _cannot_write(exc: OSError) -> int:
    """One line and exit 1, no traceback. A write to stdout names no file; anything else does."""
    what = f"cannot read or write {exc.filename}" if exc.filename else "cannot write the output"
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # what is still buffered goes nowhere at exit
        os.close(devnull)
    print(f"pitcrew: {what}: {exc.strerror or exc}", file=sys.stderr)
    return 1


def _reader_gone() -> int:
    """Whoever read our output has gone (``pitcrew catalog | head``): stop quietly, with the status
    a tool ended by SIGPIPE has (Python ignores the signal, so the write raised instead)."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # what is still buffered goes nowhere at exit
        os.close(devnull)
    return 128 + signal.SIGPIPE


def _config(args: argparse.Namespace, **overrides: Any) -> Config:
    from bot.engine.steps import REGISTRY

    return load_config(Path(args.config) if args.config else None, steps=REGISTRY, **overrides)


def _serve(args: argparse.Namespace) -> int:
    from bot.runtime import serve

    overrides: dict[str, Any] = {}
    if args.listen:
        overrides["server"] = {"listen": args.listen}
    config = _config(args, **overrides)
    if _refused(config):
        return 1
    serve(config)
    return 0


def _check(args: argparse.Namespace) -> int:
    config = _config(args)
    if _refused(config):
        return 1
    s = config.settings
    print(f"configuration OK ({config.source or 'defaults and environment'})")
    print(f"  mode {s.mode.value}; listen {s.server.listen}; store {describe_store(s.store)}")
    print(
        f"  catalog {config.catalog.version}: {len(config.catalog.xids)} XIDs, {len(config.catalog.faults)} faults"
    )
    print(f"  playbooks: {', '.join(sorted(config.playbooks.playbooks))}")
    integrations = s.integrations
    print(
        f"  scheduler {integrations.scheduler}; cluster {integrations.cluster}; "
        f"notifier {integrations.notifier}"
    )
    return _check_live(config) if args.live else 0


def _check_live(config: Config) -> int:
    """Reach every configured far side once (``bot.probes``); exit 1 naming what is missing."""
    from bot.probes import live_check, missing, render, unable

    checked = asyncio.run(live_check(config))
    print("far sides:")
    for line in render(checked):
        print(line)
    problems = missing(checked) + unable(config, checked)
    for problem in problems:
        print(f"pitcrew: check-config --live: missing {problem}", file=sys.stderr)
    return 1 if problems else 0


def _refused(config: Config) -> bool:
    """Print why a configuration may not run (``bot.safety``), one line per problem."""
    problems = port_problems(config)
    for problem in problems:
        print(f"pitcrew: refusing this configuration: {problem}", file=sys.stderr)
    return bool(problems)


def _plan(args: argparse.Namespace) -> int:
    config = _config(args)
    try:
        body = Path(args.payload).read_bytes() if args.payload != "-" else sys.stdin.buffer.read()
    except OSError as exc:
        print(f"pitcrew: cannot read {args.payload}: {exc.strerror}", file=sys.stderr)
        return 1
    try:
        plans = asyncio.run(_live_plan(config, body) if args.live else dry_run(config, body))
    except ValueError as exc:
        print(f"pitcrew: {args.payload}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(plans, indent=2) if args.json else render_plans(plans))
    return 0


async def _live_plan(config: Config, body: bytes) -> list[dict[str, Any]]:
    """The dry run with the configured far sides, read only: which node a take would choose now."""
    from bot.probes import far_sides
    from bot.runtime import build_ports

    ports = build_ports(config)
    try:
        return await dry_run(config, body, ports=ports)
    finally:
        for side in far_sides(ports):
            close = getattr(side.adapter, "aclose", None)
            if close is not None:
                await close()


def _catalog(args: argparse.Namespace) -> int:
    config = _config(args)
    rows = catalog_rows(config.catalog)
    if args.json:
        print(
            json.dumps(
                {"version": config.catalog.version, "source": config.catalog.source, "entries": rows},
                indent=2,
            )
        )
    else:
        print(f"pitcrew fault catalog {config.catalog.version} — {config.catalog.source}")
        for row in rows:
            key = f"XID {row['xid']}" if row["xid"] is not None else row["fault"]
            print(
                f"  {key:<28} {row['playbook']:<20} {row['bucket'] or '-':<22} {row['class']:<16} {row['meaning']}"
            )
            if row.get("differs"):
                print(f"  {'':<28} differs: {row['differs']}")
    return 0


def _existing_store(config: Config) -> StoreSettings | None:
    """The incident store a read command reads; ``None`` (said on stderr) when there is none."""
    settings = config.settings.store
    if settings.url is None and not settings.path.exists():
        print(f"no incident store at {settings.path}", file=sys.stderr)
        return None
    return settings


@contextlib.asynccontextmanager
async def _opened(settings: StoreSettings) -> AsyncIterator[Store]:
    store = build_store(settings)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


def _trust(args: argparse.Namespace) -> int:
    config = _config(args)
    path = _existing_store(config)
    if path is None:
        return 1

    async def read() -> list[IncidentFacts]:
        async with _opened(path) as store:
            return await trust_facts(store, args.limit)

    window, lemon = config.policy.escalation.window, config.policy.lemon
    facts = asyncio.run(read())
    rows = ledger(facts, window)
    repeat = offenders(facts, lemon.window)
    if args.json:
        print(
            json.dumps(
                {
                    "escalation_window_seconds": window.total_seconds(),
                    "rows": trust_rows(rows),
                    "lemon_window_seconds": lemon.window.total_seconds(),
                    "offenders": offender_rows(repeat),
                },
                indent=2,
            )
        )
    else:
        print(render_trust(rows, format_duration(window)))
        if repeat:
            print(render_offenders(repeat, format_duration(lemon.window)))
    return 0


def _incidents(args: argparse.Namespace) -> int:
    from bot.web.views import incident_detail, incident_view

    config = _config(args)
    path = _existing_store(config)
    if path is None:
        return 1

    leader: list[str] = []

    async def read() -> Any:
        async with _opened(path) as store:
            if args.show:
                incident = await store.incident(args.show)
                if incident is None:
                    return None
                try:
                    alerts = await store.alerts_page(
                        args.show, limit=args.alerts_limit, after=args.alerts_after
                    )
                except BadCursor as exc:
                    raise BadCursor(f"--alerts-after: {exc}") from None
                try:
                    events = await store.events_page(
                        args.show, limit=args.events_limit, after=args.events_after
                    )
                except BadCursor as exc:
                    raise BadCursor(f"--events-after: {exc}") from None
                return incident_detail(
                    incident,
                    alerts.items,
                    events.items,
                    await store.steps_of(args.show),
                    await store.approval(args.show),
                    alerts_next=alerts.next,
                    events_next=events.next,
                    links=await store.incident_links(args.show),
                )
            leader[:] = [_who_leads(await store.lease())]
            return [
                incident_view(i) for i in await store.incidents(active_only=args.active, limit=args.limit)
            ]

    try:
        data = asyncio.run(read())
    except BadCursor as exc:
        print(f"pitcrew: {exc}", file=sys.stderr)
        return 1
    if data is None:
        print(f"no incident {args.show}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(data, indent=2))
    elif args.show:
        print(render_detail(data))
        if data["events_next"]:
            print(f"  … more: pitcrew incidents show {args.show} --events-after {data['events_next']}")
    else:
        print(render_incidents(data))
        print(*leader)
    return 0


#: Events read from the store at a time by ``pitcrew audit export``.
AUDIT_PAGE = 1000


def _instant(text: str) -> datetime:
    """``--since``/``--until``: an ISO 8601 date or time; one without an offset is UTC."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"an ISO 8601 date or time (2026-06-01, 2026-06-01T12:00:00+02:00), not {text!r}"
        ) from None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _audit(args: argparse.Namespace) -> int:
    """Stream the audit log as JSON lines (one event a line, oldest first) to stdout, page by page
    through the store port, so a log of any size is exported in bounded memory; a summary on stderr."""
    from bot.web.views import audit_record

    config = _config(args)
    settings = _existing_store(config)
    if settings is None:
        return 1
    if args.since is not None and args.until is not None and args.since >= args.until:
        print("pitcrew: --since must be before --until", file=sys.stderr)
        return 1

    async def export() -> tuple[int, int, int]:
        count, first, last = 0, 0, 0
        async with _opened(settings) as store:
            while True:
                page = await store.audit_log(after=last, since=args.since, until=args.until, limit=AUDIT_PAGE)
                if not page:
                    return count, first, last
                sys.stdout.write("".join(json.dumps(audit_record(e), sort_keys=True) + "\n" for e in page))
                sys.stdout.flush()
                count, first, last = count + len(page), first or page[0].seq, page[-1].seq

    count, first, last = asyncio.run(export())
    span = f" (seq {first}..{last})" if count else ""
    print(f"exported {count} audit events{span}", file=sys.stderr)
    return 0


def _who_leads(lease: Lease | None) -> str:
    """The leadership row in one line, for the list: who acts for this store, or that nobody does."""
    if lease is None:
        return "leader: none (no pitcrew has led this store yet)"
    until = lease.expires_at.isoformat(timespec="seconds")
    if lease.expired:
        return f"leader: none (the lease of {lease.holder}, epoch {lease.epoch}, lapsed at {until})"
    return f"leader: {lease.holder} (epoch {lease.epoch}, since {lease.acquired_at.isoformat(timespec='seconds')})"


def _command(args: argparse.Namespace) -> int:
    import urllib.error
    import urllib.request

    config = _config(args)
    token_file = config.settings.server.auth.admin_token_file
    if token_file is None:
        print("pitcrew: the command API needs server.auth.admin_token_file", file=sys.stderr)
        return 1
    base = args.server or f"http://{config.settings.server.listen}"
    paths = {
        "approve": f"/api/v1/incidents/{args.incident}/approve" if hasattr(args, "incident") else "",
        "reject": f"/api/v1/incidents/{getattr(args, 'incident', '')}/reject",
        "rollback": f"/api/v1/incidents/{getattr(args, 'incident', '')}/rollback",
        "pause": "/api/v1/pause",
        "resume": "/api/v1/resume",
        "breaker-reset": "/api/v1/breaker/reset",
    }
    payload: dict[str, Any] = {
        "actor": args.actor or getpass.getuser(),
        "reason": getattr(args, "reason", ""),
    }
    if getattr(args, "force", False):
        payload["force"] = True
    body = json.dumps(payload)
    request = urllib.request.Request(  # noqa: S310 - operator-supplied local URL
        base.rstrip("/") + paths[args.verb],
        data=body.encode(),
        method="POST",
        headers={
            "Authorization": f"Bearer {read_secret(token_file, 'server.auth.admin_token_file')}",
            "Content-Type": "application/json",
            "Pitcrew-Client": "cli",  # audited as cli:<actor> (bot.web.commands)
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
            answer = json.loads(response.read())
            code = 0
    except urllib.error.HTTPError as exc:
        answer = json.loads(exc.read() or b"{}")
        code = 1
    except urllib.error.URLError as exc:
        print(f"pitcrew: cannot reach {base}: {exc.reason}", file=sys.stderr)
        return 1
    print(answer.get("message") or answer.get("error") or json.dumps(answer))
    for line in answer.get("report", []):
        print(f"  {line}")
    return code


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pitcrew", description="GPU died. Training didn't.")
    parser.add_argument("--version", action="version", version=f"pitcrew {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", "-c", help="YAML configuration file (PITCREW_* env vars override it)")
    sub = parser.add_subparsers(metavar="COMMAND")

    p = sub.add_parser("serve", parents=[common], help="run the webhook receiver and the engine")
    p.add_argument("--listen", help="HOST:PORT (overrides server.listen)")
    p.set_defaults(handler=_serve)

    p = sub.add_parser("check-config", parents=[common], help="validate configuration and catalog")
    p.add_argument(
        "--live", action="store_true", help="also reach every configured far side (changes nothing)"
    )
    p.set_defaults(handler=_check)

    p = sub.add_parser("plan", parents=[common], help="dry run: what pitcrew would do with a webhook payload")
    p.add_argument("payload", help="Alertmanager webhook JSON file, or - for stdin")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--live",
        action="store_true",
        help="also read the capacity pools (changes nothing): which node would be taken now, or why none",
    )
    p.set_defaults(handler=_plan)

    p = sub.add_parser("catalog", parents=[common], help="show the XID/ECC fault catalog")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_catalog)

    p = sub.add_parser("incidents", parents=[common], help="list incidents, or `incidents show ID`")
    p.add_argument("action", nargs="?", choices=["show"], help="show one incident with its timeline")
    p.add_argument("id", nargs="?")
    p.add_argument("--json", action="store_true")
    p.add_argument("--active", action="store_true", help="only incidents not yet finished")
    p.add_argument("--limit", type=_whole(LIST_MAX), default=50, help="most incidents listed")
    p.add_argument(
        "--alerts-limit", type=_whole(PAGE_MAX), default=PAGE_DEFAULT, help="alerts shown of one incident"
    )
    p.add_argument("--alerts-after", metavar="CURSOR", help="the page after this (an alerts_next)")
    p.add_argument(
        "--events-limit", type=_whole(PAGE_MAX), default=PAGE_DEFAULT, help="timeline events shown"
    )
    p.add_argument("--events-after", metavar="CURSOR", help="the page after this (an events_next)")
    p.set_defaults(handler=lambda a: _incidents(_show(a)))

    p = sub.add_parser(
        "trust",
        parents=[common],
        help="the trust ledger: remediations overridden by humans, retests, repeats",
    )
    p.add_argument("--json", action="store_true")
    p.add_argument("--limit", type=_whole(LIST_MAX), default=LIST_MAX, help="newest incidents read")
    p.set_defaults(handler=_trust)

    p = sub.add_parser("audit", parents=[common], help="`pitcrew audit export`: the audit log as JSON lines")
    p.add_argument("action", choices=["export"])
    p.add_argument(
        "--since", type=_instant, help="events at or after this ISO 8601 date or time (UTC if no offset)"
    )
    p.add_argument(
        "--until", type=_instant, help="events before this ISO 8601 date or time (UTC if no offset)"
    )
    p.add_argument(
        "--format", choices=["jsonl"], default="jsonl", help="one JSON object a line (the only format)"
    )
    p.set_defaults(handler=_audit)

    for verb, words in (
        ("approve", "approve a pending step"),
        ("reject", "reject a pending step"),
        ("rollback", "undo what pitcrew did for an incident"),
    ):
        p = sub.add_parser(verb, parents=[common], help=words)
        p.add_argument("incident")
        if verb == "rollback":
            p.add_argument(
                "--force", action="store_true", help="roll back even while pitcrew is paused (audited)"
            )
        _command_flags(p, verb)
    p = sub.add_parser("pause", parents=[common], help="kill switch: touch no node until resume")
    p.add_argument("--reason", default="")
    _command_flags(p, "pause")
    p = sub.add_parser("resume", parents=[common], help="lift the pause")
    _command_flags(p, "resume")
    p = sub.add_parser("breaker", parents=[common], help="circuit breaker: `pitcrew breaker reset`")
    p.add_argument("what", choices=["reset"])
    _command_flags(p, "breaker-reset")

    return parser


def _whole(maximum: int) -> Callable[[str], int]:
    def whole(text: str) -> int:
        if not text.isdecimal() or not 1 <= int(text) <= maximum:
            raise argparse.ArgumentTypeError(f"a whole number from 1 to {maximum}, not {text!r}")
        return int(text)

    return whole


def _command_flags(p: argparse.ArgumentParser, verb: str) -> None:
    p.add_argument("--server", help="pitcrew base URL (default: http://<server.listen>)")
    p.add_argument("--as", dest="actor", help="who is asking (default $USER); audited as cli:NAME")
    p.set_defaults(handler=_command, verb=verb)


def _show(args: argparse.Namespace) -> argparse.Namespace:
    args.show = args.id if args.action == "show" else None
    if args.action == "show" and not args.id:
        raise SystemExit("pitcrew incidents show: which incident? (pitcrew incidents show ID)")
    return args


if __name__ == "__main__":
    raise SystemExit(main())
