"""``python -m proving_ground.dcgm``: serve stand-in nodes until SIGTERM (the demo uses this)."""

from __future__ import annotations

import argparse
import json
import signal
import threading
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
    # Before the nodes are announced: whoever reads them may stop this at once (a test under load
    # did, and the default action ended the process before the handler was set).
    stopped = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopped.set())
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
    stopped.wait()
    standin.stop()


if __name__ == "__main__":
    main()
