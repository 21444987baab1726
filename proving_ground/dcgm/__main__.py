"""``python -m proving_ground.dcgm``: serve stand-in nodes until SIGTERM (the demo uses this)."""

from __future__ import annotations

import argparse
import json
import signal
from collections.abc import Sequence
from pathlib import Path

from proving_ground.dcgm import DEFAULT_COLLECTORS, FIELDS, Standin, load_collectors


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--nodes", default="gpu-node-01,gpu-node-02,gpu-node-03,gpu-node-04")
    parser.add_argument(
        "--listen", default="127.0.0.1:9400", help="host:port of the first node; node i: port+i"
    )
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument(
        "--collectors", type=Path, help="dcgm-exporter collectors CSV (default: the fixtures')"
    )
    parser.add_argument("--hostname-label", default="Hostname", choices=["Hostname", "hostname", "none"])
    args = parser.parse_args(argv)
    host, port = args.listen.rsplit(":", 1)
    names = [n for n in args.nodes.split(",") if n]
    collectors, fields = load_collectors(args.collectors) if args.collectors else (DEFAULT_COLLECTORS, FIELDS)
    label = None if args.hostname_label == "none" else args.hostname_label
    ports = [int(port) + i if int(port) else 0 for i in range(len(names))]
    # The stop signals are blocked before the nodes are announced (whoever reads them may stop this
    # at once: a test under load did, and the default action ended the process) and before the
    # servers' thread starts (it inherits the mask), then waited for: one sent early stays pending.
    # No handler: one that set an Event deadlocked when the signal came while this thread held the
    # Event's lock inside its own wait (a CI run hung there; a handler calling Event.set under a
    # stream of signals hangs its waiting main thread within a second).
    stops = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    standin = Standin(
        names,
        host=host,
        ports=ports,
        gpus=args.gpus,
        collectors=collectors,
        fields=fields,
        hostname_label=label,
    ).start()
    print(json.dumps({"nodes": {n: standin.address(n) for n in names}}), flush=True)
    signal.sigwait(stops)
    standin.stop()


if __name__ == "__main__":
    main()
