"""``pitcrew serve``'s Kubernetes client asks the leader's fence last, once a change's turn has come.

The engine's gated port asks the fence before a step's call, but the call can then wait: for
its turn in the client's rate limit (``kubernetes.qps``/``burst``, shared by every incident),
for a connection. A leader whose renewals fail through that wait may no longer lead when the
request leaves. With a fence, the client asks it again once the request holds its connection
(``bot.integrations.fenced``). Cases, against the emulator, with the real lease clock:

* a change sent while the lease holds goes out;
* a change that waited its turn in the rate limit past the lease raises ``Deposed``, and the
  emulator never sees it;
* reads still go (a process standing by reads the cluster for its metrics and commands).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bot.config import KubernetesSettings
from bot.integrations.kubernetes import KubernetesCluster
from bot.store.base import Deposed
from bot.store.lease import Fence
from proving_ground.kubernetes.emulator import KubeEmulator
from proving_ground.kubernetes.world import write_kubeconfig

NODE = "gpu-node-02"
QPS = 2.0  # one request every half second past the burst of one


def _changes(k8s: KubeEmulator) -> list[str]:
    return [f"{r.method} {r.path}" for r in k8s.log if r.method not in ("GET", "HEAD")]


async def test_a_change_that_waited_past_the_lease_is_not_sent(k8s: KubeEmulator, tmp_path: Path) -> None:
    fence = Fence("leader-a")
    fence.grant(1, valid_until=time.monotonic() + 60)
    told: list[str] = []
    fence.on_deposed(told.append)
    settings = KubernetesSettings(
        kubeconfig=write_kubeconfig(tmp_path / "kubeconfig", k8s.host), qps=QPS, burst=1, retries=0
    )
    cluster = KubernetesCluster(settings, fence=fence)
    try:
        await cluster.cordon(NODE, incident_id="pc-00042", reason="pitcrew: pc-00042 XID 79")
        sent = _changes(k8s)
        assert sent, "a leader's cordon never reached the cluster"

        # Renewals now fail: the lease holds for a tenth of a second more, and the uncordon
        # waits half a second for its turn in the rate limit.
        fence.grant(1, valid_until=time.monotonic() + 0.1)
        with pytest.raises(Deposed, match="may have lapsed"):
            await cluster.uncordon(NODE, incident_id="pc-00042")
        assert _changes(k8s) == sent, "a change left after the lease may have lapsed"
        assert told and "epoch 1" in told[0]

        fence.revoke()  # standing by: reads still go
        node = await cluster.node(NODE)
        assert node is not None and node.unschedulable
    finally:
        await cluster.aclose()
