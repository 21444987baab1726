"""What each ``scripts/demo --scenario`` does: the fault, where it lands, the policy, the expected end.

Pure data: the run (``proving_ground.run``) reads a ``Scenario`` and knows nothing scenario-specific.

* ``xid79`` — GPU 3 of the training job's node falls off the bus; ``replace-node`` in auto mode.
* ``ecc`` — a double-bit ECC error on that GPU; ``reset-gpu`` in auto mode.
* ``approve`` — XID 79 with ``replace-node`` in approve mode: the run stops at the approval and
  approves as a person would (``--interactive``: waits for the user's own ``pitcrew approve``).
* ``storm`` — XID 79 on twenty nodes at once; the breaker lets ``BREAKER_NODES`` through.
* ``app-xid`` — XID 13, an application fault. pitcrew's rules never page on it; the demo adds the
  common community rule that pages on every XID (``DCGM_FI_DEV_XID_ERRORS > 0``-style), so the
  alert does reach pitcrew, which notifies and touches nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

#: Nodes the storm's breaker lets through (``guards.breaker.max_nodes``; the fraction allows more).
BREAKER_NODES = 3
Outcome = Literal["recover", "notify_only", "breaker"]


@dataclass(frozen=True, slots=True)
class Fault:
    """A fault as the dcgm-exporter stand-in injects it (``proving_ground.dcgm.FAULTS``) on one GPU."""

    kind: str
    gpu: int = 3
    params: tuple[tuple[str, Any], ...] = ()

    def describe(self) -> str:
        params = dict(self.params)
        what = f"XID {params['xid']}" if self.kind == "xid" else self.kind.replace("_", " ").upper()
        return f"{what} on GPU {self.gpu}"


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    title: str
    fault: Fault
    outcome: Outcome
    #: Slurm (and Kubernetes) nodes of the proving ground, gpu-001..gpu-NNN.
    nodes: int = 3
    #: How many nodes the fault hits: the job's node first, then the others in order.
    fault_nodes: int = 1
    mode: str = "auto"
    config: dict[str, Any] = field(default_factory=dict)
    #: Extra Prometheus rules (YAML text of one rule group) loaded beside pitcrew's own.
    extra_rules: str = ""
    approval: bool = False


_XID79 = Fault("xid", params=(("xid", 79),))

# The rule many sites copy from community dashboards: every XID pages, application faults included.
_COMMUNITY_XID_RULE = """\
groups:
  - name: community-xid
    rules:
      - alert: GpuXidAny
        expr: max by (node, gpu, UUID, xid) (pitcrew:gpu_xid:recent) > 0
        labels:
          fault: xid
          severity: warning
        annotations:
          summary: XID {{ $labels.xid }} on {{ $labels.node }} GPU {{ $labels.gpu }}
"""

SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("xid79", "XID 79: a GPU falls off the bus under a training job", _XID79, "recover"),
        Scenario(
            "ecc",
            "Double-bit ECC error under a training job",
            Fault("ecc_dbe", params=(("count", 1),)),
            "recover",
        ),
        Scenario(
            "approve",
            "XID 79 with replace-node behind a human approval",
            _XID79,
            "recover",
            mode="approve",
            config={"approvals": {"approvers": ["demo", "root"]}},
            approval=True,
        ),
        Scenario(
            "storm",
            "XID 79 on twenty nodes at once: the breaker holds the blast radius",
            _XID79,
            "breaker",
            nodes=20,
            fault_nodes=20,
            config={"guards": {"breaker": {"max_nodes": BREAKER_NODES, "max_fraction": 1.0}}},
        ),
        Scenario(
            "app-xid",
            "XID 13, an application fault: pitcrew tells humans and touches nothing",
            Fault("xid", gpu=0, params=(("xid", 13),)),
            "notify_only",
            extra_rules=_COMMUNITY_XID_RULE,
        ),
    )
}
