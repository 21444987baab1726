"""A dcgm-exporter stand-in: dcgm-exporter 4.x ``/metrics``, one listener per node, GPU fault injection.

Owns the exposition layout the rules and pitcrew's tests see, and the fault model; it knows nothing
about Prometheus, rules or pitcrew. The layout follows dcgm-exporter's render template (4.5-4.8):
one ``# HELP``/``# TYPE`` block per family in DCGM field-id order, ``DCGM_EXP_*`` families last and
absent while they have no sample; labels ``gpu, UUID, pci_bus_id, device, modelName``, the node name
as ``Hostname`` (<= 4.5) or ``hostname`` (4.6+), then the sorted "labels" (``DCGM_FI_DRIVER_VERSION``
and collector labels such as ``xid``), then the sorted attributes (pod attributes, ``err_code`` and
``err_msg``); int64 fields print ``%d``, doubles ``%f``. A GPU that fell off the bus has no series.

In-process: ``with Standin(["gpu-node-01"]) as s: s.node("gpu-node-01").inject("xid", gpu=3, xid=79)``
(served from a background thread, so blocking test code never starves it). As a program, for the
demo: ``python -m proving_ground.dcgm --nodes gpu-node-01,gpu-node-02 --listen 127.0.0.1:9400``
serves node *i* on port 9400+i and prints ``{"nodes": {name: address}}`` as one JSON line.
HTTP per node: ``GET /metrics``, ``GET /state``, ``POST /inject`` with ``{"gpu": 3, "xid": 79}`` or
``{"fault": <name in FAULTS>, "gpu": 1, ...}``, ``POST /clear`` (optionally ``{"gpu": 1}``).

Modules: ``fields`` (the field table, collectors CSVs), ``node`` (GPU state, faults, rendering),
``server`` (HTTP, background thread), ``__main__`` (the program).
"""

from proving_ground.dcgm.fields import DEFAULT_COLLECTORS, FIELDS, Field, load_collectors
from proving_ground.dcgm.node import FAULTS, Node
from proving_ground.dcgm.server import ServerThread, Standin, node_app

__all__ = [
    "DEFAULT_COLLECTORS",
    "FAULTS",
    "FIELDS",
    "Field",
    "Node",
    "ServerThread",
    "Standin",
    "load_collectors",
    "node_app",
]
