"""One GPU node as its dcgm-exporter pod sees it: GPU state, injected faults, the ``/metrics`` text.

Owns the fault model (what each fault does to which series) and the exposition layout: families in
field-id order, labels ``gpu, UUID, pci_bus_id, device, modelName, Hostname|hostname``, then the
sorted "labels" (``DCGM_FI_DRIVER_VERSION``, collector labels such as ``xid``), then the sorted
attributes (pod attributes, ``err_code``/``err_msg``); ``%d`` for int64 fields, ``%f`` for doubles.
Thread-safe: faults arrive from test threads and HTTP handlers while Prometheus scrapes.
"""

from __future__ import annotations

import math
import random
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from proving_ground.dcgm.fields import (
    DEFAULT_COLLECTORS,
    DGX_H100_BUS,
    DRIVER_LABEL,
    ENERGY,
    FIELDS,
    HEALTH_WATCHES,
    POWER,
    RECOVERY_ACTION,
    RECOVERY_XID,
    XID_TEXT,
    Field,
)


@dataclass
class Gpu:
    index: int
    values: dict[str, float]
    fallen_off: bool = False
    last_xid: int = 0
    xid_seen: list[tuple[float, int]] = field(default_factory=list)  # (monotonic time, code)
    xid_total: dict[int, int] = field(default_factory=dict)
    health: dict[str, tuple[int, str]] = field(default_factory=dict)  # watch -> (status, error code)
    #: When the energy counter had its value in ``values`` (``Node.clock``), and when its readings
    #: froze, if they did.
    counted_from: float = 0.0
    frozen_at: float | None = None


class Node:
    """One GPU node as its dcgm-exporter pod sees it. Thread-safe: faults arrive from tests and HTTP."""

    def __init__(
        self,
        name: str,
        *,
        gpus: int = 8,
        collectors: Sequence[str] = DEFAULT_COLLECTORS,
        fields: dict[str, Field] | None = None,
        hostname_label: str | None = "Hostname",
        xid_window_s: float = 300.0,
        model: str = "NVIDIA H100 80GB HBM3",
        driver: str = "550.127.08",
        update_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name, self.model, self.driver, self.hostname_label = name, model, driver, hostname_label
        self.fields = fields or FIELDS
        self.families = sorted((self.fields[n] for n in collectors if n != DRIVER_LABEL), key=lambda f: f.fid)
        self.driver_label = DRIVER_LABEL in collectors
        self.xid_window_s, self.gpu_count, self.http_500, self.pod_generation = xid_window_s, gpus, False, 0
        #: How often DCGM reads a field (dcgm-exporter's collect interval): the energy counter moves
        #: by a step each time.
        self.update_s, self.clock = update_s, clock
        self._lock = threading.Lock()
        #: Label text made once (``_head``, ``_tail``): a GPU's own, and those after a family's.
        self._heads: dict[tuple[object, ...], str] = {}
        self._tails: dict[tuple[object, ...], str] = {}
        self.gpus = [self._healthy(i) for i in range(gpus)]

    def _healthy(self, i: int) -> Gpu:
        rng = random.Random(f"{self.name}/{i}")
        values = {f.name: round(rng.uniform(*f.healthy), 6) for f in FIELDS.values()}
        return Gpu(i, values, counted_from=self.clock())

    def uuid(self, i: int) -> str:
        return f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{self.name}/{i}')}"

    def pod(self) -> str:
        suffix = "".join(c for c in self.name if c.isdigit())[-2:] or "00"
        return f"llama-pretrain-worker-{suffix}" + (f"-r{self.pod_generation}" if self.pod_generation else "")

    def set_value(self, family: str, gpu: int, value: float) -> None:
        with self._lock:
            self.gpus[gpu].values[family] = value
            if family == ENERGY:
                self.gpus[gpu].counted_from = self.clock()

    def inject(self, fault: str = "xid", gpu: int = 0, **params: Any) -> None:
        """Apply one fault (see ``FAULTS``); counters only ever grow, as on a real GPU."""
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
        with self._lock:
            g, count = self.gpus[gpu], int(params.get("count", 1))
            if fault == "xid":
                code = int(params["xid"])
                g.last_xid = code
                g.xid_seen.append((time.monotonic(), code))
                g.xid_total[code] = g.xid_total.get(code, 0) + 1
                if code == RECOVERY_XID:  # the driver logs it when the GPU's recovery action changes
                    g.values[RECOVERY_ACTION] = float(params.get("action", 1))
            elif fault == "fallen_off":
                g.fallen_off = True
            elif fault == "frozen":
                g.frozen_at = g.frozen_at if g.frozen_at is not None else self.clock()
            elif fault in ("ecc_dbe", "ecc_sbe"):
                kind = fault[-3:].upper()
                for scope in ("VOL", "AGG"):
                    g.values[f"DCGM_FI_DEV_ECC_{kind}_{scope}_TOTAL"] += count
            elif fault in ("row_remap_failure", "row_remap_pending"):
                g.values[f"DCGM_FI_DEV_{fault.upper()}"] = 1
            elif fault == "uncorrectable_remap":
                g.values["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"] += count
            elif fault == "health_fail":
                g.health[params.get("watch", "ALL")] = (20, params.get("code", "DCGM_FR_UNKNOWN"))
            elif fault == "nvlink_errors":
                g.values[f"DCGM_FI_DEV_NVLINK_{params.get('counter', 'CRC_FLIT')}_ERROR_COUNT_TOTAL"] += count
            elif fault == "thermal":
                g.values["DCGM_FI_DEV_GPU_TEMP"] = float(params.get("temp", 95))
            elif fault == "exporter_500":
                self.http_500 = True
            elif fault == "pod_churn":
                self.pod_generation += 1

    def clear(self, gpu: int | None = None) -> None:
        """Back to healthy: the GPU was reset or replaced and the exporter restarted (counters from 0)."""
        with self._lock:
            for i in range(self.gpu_count) if gpu is None else (gpu,):
                self.gpus[i] = self._healthy(i)
            self.http_500 = self.http_500 and gpu is not None

    def state(self) -> dict[str, Any]:
        with self._lock:
            return {
                "node": self.name,
                "http_500": self.http_500,
                "gpus": [
                    {
                        "gpu": g.index,
                        "fallen_off": g.fallen_off,
                        "frozen": g.frozen_at is not None,
                        "last_xid": g.last_xid,
                        "xid_total": g.xid_total,
                        "health": {w: list(h) for w, h in g.health.items()},
                    }
                    for g in self.gpus
                ],
            }

    def render(self) -> str:
        """The exact ``/metrics`` body."""
        with self._lock:
            live = [g for g in self.gpus if not g.fallen_off]
            out: list[str] = []
            for family in self.families:
                lines = [line for g in live for line in self._samples(family, g)]
                if lines:
                    out += [
                        f"# HELP {family.name} {family.help}",
                        f"# TYPE {family.name} {family.type}",
                        *lines,
                    ]
            return "\n".join(out) + "\n"

    def _samples(self, family: Field, g: Gpu) -> list[str]:
        name, window = family.name, str(int(self.xid_window_s * 1000))
        if name == "DCGM_FI_DEV_XID_ERRORS":
            text = XID_TEXT.get(g.last_xid, "Unknown Error")
            return [self._line(family, g, g.last_xid, {}, {"err_code": str(g.last_xid), "err_msg": text})]
        if name == "DCGM_EXP_XID_ERRORS_COUNT":
            recent: dict[int, int] = {}
            for at, code in g.xid_seen:
                if time.monotonic() - at <= self.xid_window_s:
                    recent[code] = recent.get(code, 0) + 1
            if not recent:
                return [self._line(family, g, 0, {"window_size_in_ms": window})]
            return [
                self._line(family, g, n, {"window_size_in_ms": window, "xid": str(code)})
                for code, n in recent.items()
            ]
        if name == "DCGM_EXP_GPU_HEALTH_STATUS":
            return [
                self._line(family, g, status, {"health_error_code": code, "health_watch": watch})
                for watch in HEALTH_WATCHES
                for status, code in [g.health.get(watch, (0, "DCGM_FR_OK"))]
            ]
        if name == "DCGM_EXP_XID_ERRORS_TOTAL":
            return [self._line(family, g, n, {"xid": str(code)}) for code, n in g.xid_total.items()]
        if name == ENERGY:
            return [self._line(family, g, self._energy(g))]
        return [self._line(family, g, g.values[name])]

    def _energy(self, g: Gpu) -> float:
        """The energy counter (mJ) at DCGM's last reading: its value when set, plus the GPU's power
        for every reading since, until its readings froze."""
        until = self.clock() if g.frozen_at is None else g.frozen_at
        readings = max(math.floor((until - g.counted_from) / self.update_s), 0)
        return g.values[ENERGY] + g.values[POWER] * 1000 * self.update_s * readings

    def _line(
        self,
        family: Field,
        g: Gpu,
        value: float,
        labels: dict[str, str] | None = None,
        attrs: dict[str, str] | None = None,
    ) -> str:
        number = f"{value:f}" if family.kind == "f" else f"{int(value):d}"
        return f"{family.name}{{{self._head(g.index)},{self._tail(labels, attrs)}}} {number}"

    def _head(self, index: int) -> str:
        """The labels a GPU always has, in dcgm-exporter's order, escaped once (a render is 20 to 40
        lines per GPU: made afresh for each line, they took most of a scrape's time)."""
        key = (index, self.name, self.model, self.hostname_label)  # a test may rename the label
        if (head := self._heads.get(key)) is None:
            bus = DGX_H100_BUS[index] if index < len(DGX_H100_BUS) else f"{0x10 + index:02X}"
            pairs = [
                ("gpu", str(index)),
                ("UUID", self.uuid(index)),
                ("pci_bus_id", f"00000000:{bus}:00.0"),
                ("device", f"nvidia{index}"),
                ("modelName", self.model),
            ]
            if self.hostname_label:
                pairs.append((self.hostname_label, self.name))
            head = self._heads[key] = _labels(pairs)
        return head

    def _tail(self, labels: dict[str, str] | None, attrs: dict[str, str] | None) -> str:
        """The driver and a family's own labels, sorted; then the pod's and the attributes', sorted."""
        key = (
            tuple((labels or {}).items()),
            tuple((attrs or {}).items()),
            self.pod_generation,
            self.driver if self.driver_label else None,
        )
        if (tail := self._tails.get(key)) is None:
            extra = {**({DRIVER_LABEL: self.driver} if self.driver_label else {}), **(labels or {})}
            pod = {"container": "trainer", "namespace": "ml-train", "pod": self.pod()}
            tail = self._tails[key] = _labels(
                sorted(extra.items()) + sorted({**pod, **(attrs or {})}.items())
            )
        return tail


def _labels(pairs: Sequence[tuple[str, str]]) -> str:
    return ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


FAULTS = (
    "xid",
    "fallen_off",
    "ecc_dbe",
    "ecc_sbe",
    "row_remap_failure",
    "row_remap_pending",
    "uncorrectable_remap",
    "health_fail",
    "nvlink_errors",
    "thermal",
    "frozen",
    "exporter_500",
    "pod_churn",
)
