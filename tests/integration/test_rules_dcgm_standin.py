"""The dcgm-exporter stand-in the rules are proven against renders what dcgm-exporter renders.

Cases:
- byte for byte equal to each captured scrape in tests/fixtures/dcgm/ (healthy node, XID 79 on one
  GPU, a GPU fallen off the bus), given the fixture's telemetry values: same families in the same
  order, same label order, same number formatting, same XID attributes;
- ``promtool check metrics`` parses its output with every fault injected (lint findings only, the
  ones the real exporter gets too);
- the 4.6+ ``hostname`` spelling, no hostname label, pod churn;
- the energy counter grows by the GPU's power at each of DCGM's readings, and stops when the GPU's
  readings freeze (one GPU, not its neighbours) until the GPU is cleared;
- the shipped collectors CSV loads and decides which families appear;
- the HTTP API: /metrics, /inject, /clear, an exporter answering 500, bad requests;
- ``python -m proving_ground.dcgm`` serves each node on its own port and stops on SIGTERM, and
  on a storm of stop signals too (a handler setting an Event deadlocked when a signal came while
  the main thread held that Event's lock: a CI run hung there).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from proving_ground.assets import COLLECTORS_CSV, REPO
from proving_ground.dcgm import FIELDS, Node, Standin, load_collectors
from proving_ground.proc import stop_process
from proving_ground.prometheus import http_json
from tests.conftest import FIXTURES
from tests.harness.proc import require_binary

SAMPLE = re.compile(r'^(?P<family>\w+)\{gpu="(?P<gpu>\d+)",.*\} (?P<value>\S+)$')
#: families whose values a test may set; the others are rendered from the fault state
TELEMETRY = {name for name in FIELDS if not name.startswith("DCGM_EXP_") and name != "DCGM_FI_DEV_XID_ERRORS"}


def node_like_fixture(name: str, fixture: str) -> tuple[Node, bytes]:
    """A stand-in node carrying the fixture's telemetry values (the stand-in's own are modelled)."""
    raw = (FIXTURES / "dcgm" / fixture).read_bytes()
    node = Node(name)
    for line in raw.decode().splitlines():
        match = SAMPLE.match(line)
        if match and match["family"] in TELEMETRY:
            node.set_value(match["family"], int(match["gpu"]), float(match["value"]))
    return node, raw


@pytest.mark.parametrize(
    ("fixture", "node_name", "fault"),
    [
        ("gpu-node-01-healthy.txt", "gpu-node-01", None),
        ("gpu-node-02-gpu3-xid79.txt", "gpu-node-02", {"fault": "xid", "gpu": 3, "xid": 79}),
        ("gpu-node-03-gpu1-fallen-off.txt", "gpu-node-03", {"fault": "fallen_off", "gpu": 1}),
    ],
)
def test_renders_the_captured_scrapes_byte_for_byte(
    fixture: str, node_name: str, fault: dict[str, Any] | None
) -> None:
    node, expected = node_like_fixture(node_name, fixture)
    if fault:
        node.inject(**fault)
    assert node.render().encode() == expected


def test_uuids_match_the_captured_alerts() -> None:
    alert = json.loads((FIXTURES / "alertmanager" / "xid79-firing.json").read_text())["alerts"][0]
    assert Node("gpu-node-02").uuid(3) == alert["labels"]["UUID"]


def test_promtool_parses_the_output_with_every_fault(tmp_path: Path) -> None:
    promtool = require_binary("promtool", "prometheus")
    collectors, fields = load_collectors(COLLECTORS_CSV)
    node = Node("gpu-node-05", collectors=collectors, fields=fields, hostname_label="hostname")
    for fault in (
        {"xid": 79, "gpu": 0},
        {"xid": 13, "gpu": 0},
        {"fault": "ecc_dbe", "gpu": 1},
        {"fault": "row_remap_failure", "gpu": 2},
        {"fault": "row_remap_pending", "gpu": 2},
        {"fault": "uncorrectable_remap", "gpu": 2},
        {"fault": "health_fail", "gpu": 3, "watch": "MEM"},
        {"fault": "nvlink_errors", "gpu": 4, "count": 500},
        {"fault": "thermal", "gpu": 5},
        {"fault": "fallen_off", "gpu": 6},
    ):
        node.inject(**fault)
    result = subprocess.run(
        [promtool, "check", "metrics"],
        input=node.render(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    findings = (result.stdout + result.stderr).splitlines()
    assert result.returncode in (0, 3), findings[-5:]  # 3: lint findings only
    unexpected = [
        f for f in findings if not re.search(r"snake_case|_total\" suffix|include type 'counter'", f)
    ]
    assert not unexpected, unexpected[:5]


def test_label_spellings_and_pod_churn() -> None:
    assert 'hostname="n1",' in Node("n1", hostname_label="hostname").render()
    assert "ostname=" not in Node("n1", hostname_label=None).render()
    node = Node("gpu-node-07")
    before = node.render()
    node.inject("pod_churn")
    assert 'pod="llama-pretrain-worker-07"' in before
    after = node.render()
    assert 'pod="llama-pretrain-worker-07-r1"' in after and 'pod="llama-pretrain-worker-07"' not in after
    # A label spelled otherwise on a node already scraped (tests/e2e/test_detection_alerts.py does).
    node.hostname_label = "hostname"
    renamed = node.render()
    assert renamed.count('hostname="gpu-node-07",') == after.count('Hostname="gpu-node-07",') > 0
    assert "Hostname=" not in renamed


def test_energy_counter_grows_at_each_reading_until_frozen() -> None:
    now = [100.0]
    node = Node("gpu-node-04", update_s=30.0, clock=lambda: now[0])

    def energy() -> dict[int, int]:
        return {
            int(m["gpu"]): int(m["value"])
            for m in map(SAMPLE.match, node.render().splitlines())
            if m and m["family"] == "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
        }

    start, power = energy(), node.gpus[1].values["DCGM_FI_DEV_POWER_USAGE"]
    now[0] += 29.9  # no reading since
    assert energy() == start
    now[0] += 0.1  # one reading: 30 s at the GPU's power, in mJ
    assert energy()[1] - start[1] == pytest.approx(power * 30_000, abs=1) and energy()[0] > start[0]
    node.inject("frozen", gpu=1)
    frozen = energy()
    now[0] += 300
    later = energy()
    assert later[1] == frozen[1] and later[0] - frozen[0] == pytest.approx(
        node.gpus[0].values["DCGM_FI_DEV_POWER_USAGE"] * 300_000, abs=1
    )
    assert node.state()["gpus"][1]["frozen"] and not node.state()["gpus"][0]["frozen"]
    node.clear(1)  # the exporter restarted: the GPU is read again
    assert not node.state()["gpus"][1]["frozen"]
    cleared = energy()[1]
    now[0] += 30
    assert energy()[1] > cleared


def test_collectors_csv_decides_the_families() -> None:
    collectors, fields = load_collectors(COLLECTORS_CSV)
    text = Node("gpu-node-01", collectors=collectors, fields=fields).render()
    families = re.findall(r"^# TYPE (\w+) ", text, flags=re.MULTILINE)
    assert "DCGM_FI_DEV_ROW_REMAP_PENDING" in families
    assert "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL" in families
    assert families[-2:] == ["DCGM_EXP_XID_ERRORS_COUNT", "DCGM_EXP_GPU_HEALTH_STATUS"]  # TOTAL: no XID yet
    assert [FIELDS[f].fid for f in families] == sorted(FIELDS[f].fid for f in families)


def test_xid_154_comes_with_the_recovery_action_it_announces() -> None:
    """The driver logs XID 154 when a GPU's recovery action changes; the action itself is field 1523
    (NVML ``nvmlDeviceGpuRecoveryAction_t``), which the exporter reports beside it."""
    collectors, fields = load_collectors(COLLECTORS_CSV)
    node = Node("gpu-node-05", collectors=collectors, fields=fields)

    def action(gpu: int) -> float:
        line = next(
            m for m in map(SAMPLE.match, node.render().splitlines())
            if m and m["family"] == "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION" and m["gpu"] == str(gpu)
        )  # fmt: skip
        return float(line["value"])

    assert action(2) == 0  # none while healthy
    node.inject("xid", gpu=2, xid=154, action=2)  # node reboot required
    assert (action(2), action(1)) == (2, 0)
    node.inject("xid", gpu=1, xid=154)  # the commonest: a GPU reset
    assert action(1) == 1
    node.clear(1)
    assert action(1) == 0


def test_http_api_injects_clears_and_fails_on_request() -> None:
    with Standin(["gpu-node-01", "gpu-node-02"]) as standin:
        base = f"http://{standin.address('gpu-node-02')}"
        with urllib.request.urlopen(f"{base}/metrics", timeout=5) as response:
            assert response.headers["Content-Type"] == "text/plain; charset=utf-8"
            assert response.read().decode() == standin.node("gpu-node-02").render()
        state = http_json(f"{base}/inject", {"gpu": 3, "xid": 79})
        assert state["gpus"][3]["xid_total"] == {"79": 1}
        assert 'err_code="79",err_msg="GPU has fallen off the bus"' in standin.node("gpu-node-02").render()
        assert 'err_code="79"' not in standin.node("gpu-node-01").render()
        http_json(f"{base}/inject", {"fault": "exporter_500"})
        with pytest.raises(urllib.error.HTTPError) as failed:
            urllib.request.urlopen(f"{base}/metrics", timeout=5)
        assert failed.value.code == 500
        with pytest.raises(urllib.error.HTTPError) as bad:
            http_json(f"{base}/inject", {"fault": "melted", "gpu": 0})
        assert bad.value.code == 400
        state = http_json(f"{base}/clear", {})
        assert not state["http_500"] and state["gpus"][3]["xid_total"] == {}


PROGRAM = [
    sys.executable,
    "-m",
    "proving_ground.dcgm",
    "--nodes",
    "n1,n2",
    "--listen",
    "127.0.0.1:0",
    "--collectors",
    str(COLLECTORS_CSV),
]


def test_runs_as_a_program_one_port_per_node() -> None:
    with subprocess.Popen(PROGRAM, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as proc:
        try:
            assert proc.stdout is not None
            nodes = json.loads(proc.stdout.readline())["nodes"]
            assert set(nodes) == {"n1", "n2"} and nodes["n1"] != nodes["n2"]
            with urllib.request.urlopen(f"http://{nodes['n2']}/metrics", timeout=5) as response:
                assert 'Hostname="n2"' in response.read().decode()
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=10) == 0
        finally:
            stop_process(proc)


def test_a_storm_of_stop_signals_stops_the_program_cleanly() -> None:
    with subprocess.Popen(PROGRAM, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as proc:
        try:
            assert proc.stdout is not None
            json.loads(proc.stdout.readline())
            for sent in range(2000):
                if proc.poll() is not None:
                    break
                proc.send_signal(signal.SIGTERM if sent % 2 else signal.SIGINT)
            assert proc.wait(timeout=10) == 0
        finally:
            stop_process(proc)
