"""A kubeconfig exec plugin (client.authentication.k8s.io/v1beta1), as ``aws eks get-token`` or
``gke-gcloud-auth-plugin`` are: it asks the emulator's identity provider for a token valid ``ttl``
seconds and prints the ``ExecCredential`` with its ``expirationTimestamp``.

    python -m proving_ground.kubernetes.exec_credential http://127.0.0.1:PORT TTL [BROKEN_FILE]

While ``BROKEN_FILE`` exists it fails as a plugin whose login expired does: exit 1, the reason on
stderr. Each run is counted in ``BROKEN_FILE``'s directory's ``exec-runs`` when that is given.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

API_VERSION = "client.authentication.k8s.io/v1beta1"


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print("usage: exec_credential <emulator url> <ttl seconds> [broken file]", file=sys.stderr)
        return 2
    if len(argv) == 3:
        broken = Path(argv[2])
        runs = broken.parent / "exec-runs"
        runs.write_text(str(int(runs.read_text() or "0") + 1 if runs.exists() else 1))
        if broken.exists():
            print(f"error: {broken.read_text().strip()}", file=sys.stderr)
            return 1
    request = urllib.request.Request(f"{argv[0].rstrip('/')}/emulator/token?ttl={argv[1]}", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            issued = json.loads(answer.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"error: no token from the identity provider: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"apiVersion": API_VERSION, "kind": "ExecCredential", "status": issued}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
