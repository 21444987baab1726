"""The dcgm-exporter fields the stand-in knows: names, DCGM field ids (the family order), types, help.

Owns the field table (HELP texts and types as in dcgm-exporter's CSVs of the 4.5-4.8 era, field ids
from dcgm_fields.h) and reading a collectors CSV into the families a node renders. dcgm-exporter's
own ``DCGM_EXP_*`` collectors sort after every DCGM field.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple


class Field(NamedTuple):
    name: str
    fid: int  # DCGM field id: the family order
    type: str
    help: str
    kind: str  # "i" (int64, %d) or "f" (double, %f)
    healthy: tuple[float, float] = (0, 0)  # range of the modelled healthy value


_F = Field
# fmt: off
FIELDS = {f.name: f for f in (
    _F("DCGM_FI_DEV_SM_CLOCK", 100, "gauge", "SM clock frequency (in MHz).", "i", (1980, 1980)),
    _F("DCGM_FI_DEV_MEM_CLOCK", 101, "gauge", "Memory clock frequency (in MHz).", "i", (2619, 2619)),
    _F("DCGM_FI_DEV_MEMORY_TEMP", 140, "gauge", "Memory temperature (in C).", "i", (45, 62)),
    _F("DCGM_FI_DEV_GPU_TEMP", 150, "gauge", "GPU temperature (in C).", "i", (55, 70)),
    _F("DCGM_FI_DEV_POWER_USAGE", 155, "gauge", "Power draw (in W).", "f", (550, 700)),
    _F("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 156, "counter", "Total energy consumption since boot (in mJ).",
       "i", (2e11, 8e11)),
    _F("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 202, "counter", "Total number of PCIe retries.", "i"),
    _F("DCGM_FI_DEV_GPU_UTIL", 203, "gauge", "GPU utilization (in %).", "i", (90, 100)),
    _F("DCGM_FI_DEV_MEM_COPY_UTIL", 204, "gauge", "Memory utilization (in %).", "i", (35, 55)),
    _F("DCGM_FI_DEV_ENC_UTIL", 206, "gauge", "Encoder utilization (in %).", "i"),
    _F("DCGM_FI_DEV_DEC_UTIL", 207, "gauge", "Decoder utilization (in %).", "i"),
    _F("DCGM_FI_DEV_XID_ERRORS", 230, "gauge", "Value of the last XID error encountered.", "i"),
    _F("DCGM_FI_DEV_POWER_VIOLATION", 240, "counter", "Throttling duration due to power constraints (in ns).", "i"),
    _F("DCGM_FI_DEV_THERMAL_VIOLATION", 241, "counter", "Throttling duration due to thermal constraints (in ns).",
       "i"),
    _F("DCGM_FI_DEV_FB_FREE", 251, "gauge", "Framebuffer memory free (in MiB).", "i", (6021, 6021)),
    _F("DCGM_FI_DEV_FB_USED", 252, "gauge", "Framebuffer memory used (in MiB).", "i", (74986, 74986)),
    _F("DCGM_FI_DEV_FB_RESERVED", 253, "gauge", "Framebuffer memory reserved (in MiB).", "i", (552, 552)),
    _F("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 310, "counter", "Total number of single-bit volatile ECC errors.", "i"),
    _F("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 311, "counter", "Total number of double-bit volatile ECC errors.", "i"),
    _F("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", 312, "counter", "Total number of single-bit persistent ECC errors.", "i"),
    _F("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", 313, "counter", "Total number of double-bit persistent ECC errors.", "i"),
    _F("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", 393, "counter", "Number of remapped rows for uncorrectable errors",
       "i"),
    _F("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", 394, "counter", "Number of remapped rows for correctable errors",
       "i"),
    _F("DCGM_FI_DEV_ROW_REMAP_FAILURE", 395, "gauge", "Whether remapping of rows has failed", "i"),
    _F("DCGM_FI_DEV_ROW_REMAP_PENDING", 396, "gauge", "Whether remapping of rows is pending", "i"),
    _F("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", 409, "counter",
       "Total number of NVLink flow-control CRC errors.", "i"),
    _F("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", 419, "counter", "Total number of NVLink data CRC errors.",
       "i"),
    _F("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", 429, "counter", "Total number of NVLink retries.", "i"),
    _F("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", 439, "counter", "Total number of NVLink recovery errors.",
       "i"),
    _F("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", 449, "counter",
       "Total number of NVLink bandwidth counters for all lanes.", "i", (1e12, 8e12)),
    _F("DCGM_FI_DEV_VGPU_LICENSE_STATUS", 526, "gauge", "vGPU License status", "i"),
    _F("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 1001, "gauge", "Ratio of time the graphics engine is active.", "f",
       (0.9, 1.0)),
    _F("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 1004, "gauge", "Ratio of cycles the tensor (HMMA) pipe is active.", "f",
       (0.35, 0.55)),
    _F("DCGM_FI_PROF_DRAM_ACTIVE", 1005, "gauge",
       "Ratio of cycles the device memory interface is active sending or receiving data.", "f", (0.3, 0.5)),
    _F("DCGM_FI_PROF_PCIE_TX_BYTES", 1009, "gauge", "The rate of data transmitted over the PCIe bus - including"
       " both protocol headers and data payloads - in bytes per second.", "i", (2e7, 6e7)),
    _F("DCGM_FI_PROF_PCIE_RX_BYTES", 1010, "gauge", "The rate of data received over the PCIe bus - including"
       " both protocol headers and data payloads - in bytes per second.", "i", (2e7, 6e7)),
    # named DCGM_FI_DEV_GPU_RECOVERY_ACTION from DCGM 4.6; the old name stays accepted
    _F("DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION", 1523, "gauge", "Recovery action recommended by the driver.", "i"),
    # dcgm-exporter's own collectors: always after the DCGM fields, in this order
    _F("DCGM_EXP_XID_ERRORS_COUNT", 1 << 30, "counter", "reported XIDs during last window", "i"),
    _F("DCGM_EXP_GPU_HEALTH_STATUS", 1 << 30 | 1, "counter", "DCGM reported health status", "i"),
    _F("DCGM_EXP_XID_ERRORS_TOTAL", 1 << 30 | 2, "counter", "Total XID errors observed since exporter start.", "i"),
)}
# fmt: on
DRIVER_LABEL = "DCGM_FI_DRIVER_VERSION"
#: XID 154 ("GPU Recovery Action Changed") and the field holding the action it announces (NVML
#: ``nvmlDeviceGpuRecoveryAction_t``: 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset).
RECOVERY_XID, RECOVERY_ACTION = 154, "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION"
#: The energy counter (mJ), which grows with the power drawn (W) while DCGM reads the GPU.
ENERGY, POWER = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_POWER_USAGE"
#: The collectors behind tests/fixtures/dcgm/: the upstream default CSV plus ECC, violations, NVLink errors.
DEFAULT_COLLECTORS = (
    *(n for n in FIELDS if n not in {"DCGM_FI_DEV_ROW_REMAP_PENDING", "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION"}),
    DRIVER_LABEL,
)
HEALTH_WATCHES = ("PCIE", "NVLINK", "PMU", "MCU", "MEM", "SM", "INFOROM", "THERMAL", "POWER", "DRIVER", "ALL")
#: err_msg texts of the XIDs tests use, as dcgm-exporter spells them; others are "Unknown Error"
XID_TEXT = {
    0: "No Error",
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors -- Most likely to see when running multiple cuda",
    48: "Double Bit ECC Error",
    62: "Internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    74: "NVLINK Error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    119: "GSP RPC Timeout",
    120: "GSP Error",
    154: "GPU Recovery Action Changed",
}
DGX_H100_BUS = ("1B", "43", "52", "61", "9D", "C3", "D1", "DF")


def load_collectors(path: Path) -> tuple[tuple[str, ...], dict[str, Field]]:
    """Field names enabled by a dcgm-exporter collectors CSV, with that CSV's TYPE and HELP texts."""
    names, fields = [], dict(FIELDS)
    for raw in path.read_text().splitlines():
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        name, type_, help_ = (part.strip() for part in raw.split(",", 2))
        if name != DRIVER_LABEL:
            if name not in FIELDS:
                raise ValueError(f"{path}: the stand-in does not model {name}")
            fields[name] = FIELDS[name]._replace(type=type_, help=help_)
        names.append(name)
    return tuple(names), fields
