"""The provider action of the ``delete-node`` strategy, against the emulator's cloud: terminate the
instance behind ``$PITCREW_NODE`` (what ``aws autoscaling terminate-instance-in-auto-scaling-group``
or ``gcloud compute instance-groups managed delete-instances`` does), so its group launches a new one.

    python -m proving_ground.kubernetes.cloud http://127.0.0.1:PORT

Exit 0 once the cloud accepted it; 1 with the cloud's answer otherwise.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not os.environ.get("PITCREW_NODE"):
        print("usage: PITCREW_NODE=<node> python -m proving_ground.kubernetes.cloud <emulator url>")
        return 2
    url = f"{argv[0].rstrip('/')}/emulator/cloud/terminate/{os.environ['PITCREW_NODE']}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=10) as answer:
            print(answer.read().decode())
    except (urllib.error.URLError, OSError) as exc:
        print(f"terminate {os.environ['PITCREW_NODE']}: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
