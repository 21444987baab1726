"""Every node in the scontrol backend's list, the ones 22.05 hides included, against scripted
``scontrol`` and ``sinfo`` that answer as the real ones did.

22.05's slurmctld leaves a powered-down ``State=CLOUD`` node out of every list of nodes unless
``PrivateData=cloud`` (``node_mgr.c`` ``pack_all_node``, ``_is_cloud_hidden``): ``scontrol --all show
node`` and ``sinfo -N`` alike, not a partition's ``Nodes=`` nor a read of the node alone (``sinfo -n
NAME``, ``pack_one_node``). The lines below are the harness cluster's (gpu-003 the cloud node, DOWN
by an administrator and powered down; ``tests/integration/test_slurm_cloud_nodes.py`` reads the real
one). Cases, each saying which commands ran:
* 22.05: the list lacks gpu-003, the partition names it: it is read alone and returned, DOWN with
  the administrator's reason;
* 24.11 (and 23.02 on, told by ``scontrol --version``, read once): the list has it, and nothing
  else is read (no partitions, nothing alone); a version that cannot be read is taken for one
  whose lists may hide nodes;
* a ``State=FUTURE`` node, listed with ``--future``: not returned, not read alone;
* a partition of ``Nodes=ALL`` names no node to read alone;
* a partition's node that ``sinfo -n`` does not find either (gone from Slurm): left out;
* ``sinfo -n`` failing otherwise (slurmctld lost): the read fails as a transient error, not a
  fleet with the node quietly missing.
Failed before: the list alone was returned (no gpu-003 on 22.05).
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from bot.engine.errors import Reason, TransientError
from bot.integrations.slurm.cli import ScontrolScheduler

IDLE = (
    "NodeName={name} Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 Gres=gpu:h100:8 "
    "NodeAddr=127.0.0.1 NodeHostName=localhost Version=22.05.8 RealMemory=2048 AllocMem=0 Sockets=2 "
    "Boards=1 State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=gpu  "
    "SlurmdStartTime=2026-12-06T23:14:54 LastBusyTime=2026-12-06T23:14:58 CfgTRES=cpu=2,mem=2G,billing=2"
)
CLOUD_LISTED = (
    "NodeName=gpu-003 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 Gres=gpu:h100:8 "
    "NodeAddr=gpu-003 NodeHostName=gpu-003 Version=24.11.5 RealMemory=2048 AllocMem=0 Sockets=2 Boards=1 "
    "State=DOWN+CLOUD+POWERED_DOWN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A "
    "Partitions=gpu  SlurmdStartTime=2026-12-06T23:15:26 LastBusyTime=Unknown "
    "CfgTRES=cpu=2,mem=2G,billing=2 Reason=admin: psu swap [root@2026-12-06T23:15:26]"
)
FUTURE = "NodeName=gpu-004 CoresPerSocket=1 CPUAlloc=0 CPUTot=2 State=FUTURE Partitions=gpu"
PARTITION = "PartitionName=gpu AllowGroups=ALL Default=YES Hidden=NO Nodes={nodes} State=UP TotalNodes=3"
#: ``sinfo -h -N -n gpu-003 -O NodeList:|,StateComplete:|,UserLong:|,TimeStamp:|,Gres:|,Reason:|``
CLOUD_ALONE = "gpu-003|down+cloud+powered_down|root(0)|2026-12-06T23:15:26|gpu:h100:8|admin: psu swap|"


def _scripted(
    bin_dir: Path, nodes: list[str], partitions: list[str], alone: dict[str, str], version: str = "22.05.8"
) -> Path:
    """``scontrol`` answering ``--version`` (``slurm VERSION``; an empty ``version``: it fails),
    ``show node`` and ``show partition``, ``sinfo -n NAME`` answering ``alone[NAME]`` (nothing for
    another node, as sinfo does); each call logged to the file returned."""
    calls = bin_dir / "calls.log"
    (bin_dir / "nodes.txt").write_text("".join(f"{line}\n" for line in nodes))
    (bin_dir / "partitions.txt").write_text("".join(f"{line}\n" for line in partitions))
    for name, line in alone.items():
        (bin_dir / f"alone-{name}.txt").write_text(f"{line}\n")
    scripts = {
        "scontrol": (
            f'echo "scontrol $*" >> {calls}\n'
            f'case "$*" in *" node "*) cat {bin_dir}/nodes.txt ;; *partition*) cat {bin_dir}/partitions.txt ;;'
            + (f' --version) echo "slurm {version}" ;;' if version else "")
            + " *) exit 1 ;; esac\n"
        ),
        "sinfo": (
            f'echo "sinfo $*" >> {calls}\n'
            'while [ "$#" -gt 0 ]; do [ "$1" = "-n" ] && name="$2"; shift; done\n'
            f"[ -f {bin_dir}/alone-$name.txt ] && cat {bin_dir}/alone-$name.txt\nexit 0\n"
        ),
    }
    for program, body in scripts.items():
        script = bin_dir / program
        script.write_text(f"#!/bin/sh\n{body}")
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return calls


ALL3 = [PARTITION.format(nodes="gpu-[001-003]")]
LIST = "scontrol --all --future show node -o"
VERSION = "scontrol --version"
PARTITIONS = "scontrol --all --oneliner show partition"


@pytest.mark.parametrize(
    ("version", "listed", "partitions", "alone", "expected", "ran"),
    [
        (
            "22.05.8",
            [IDLE.format(name="gpu-001"), IDLE.format(name="gpu-002")],
            ALL3,
            {"gpu-003": CLOUD_ALONE},
            {"gpu-001": None, "gpu-002": None, "gpu-003": "admin: psu swap"},
            [LIST, VERSION, PARTITIONS, "sinfo gpu-003"],
        ),
        (
            "24.11.5",
            [IDLE.format(name="gpu-001"), IDLE.format(name="gpu-002"), CLOUD_LISTED],
            ALL3,
            {},
            {"gpu-001": None, "gpu-002": None, "gpu-003": "admin: psu swap"},
            [LIST, VERSION],
        ),
        (
            "22.05.8",
            [IDLE.format(name="gpu-001"), IDLE.format(name="gpu-002"), CLOUD_LISTED, FUTURE],
            [PARTITION.format(nodes="gpu-[001-004]")],
            {},
            {"gpu-001": None, "gpu-002": None, "gpu-003": "admin: psu swap"},
            [LIST, VERSION, PARTITIONS],
        ),
        (
            "22.05.8",
            [IDLE.format(name="gpu-001"), IDLE.format(name="gpu-002")],
            [PARTITION.format(nodes="ALL")],
            {"gpu-003": CLOUD_ALONE},
            {"gpu-001": None, "gpu-002": None},
            [LIST, VERSION, PARTITIONS],
        ),
        (
            "22.05.8",
            [IDLE.format(name="gpu-001"), IDLE.format(name="gpu-002")],
            ALL3,
            {},
            {"gpu-001": None, "gpu-002": None},
            [LIST, VERSION, PARTITIONS, "sinfo gpu-003"],
        ),
        (
            "",  # scontrol --version fails: the lists may hide nodes
            [IDLE.format(name="gpu-001"), IDLE.format(name="gpu-002")],
            ALL3,
            {"gpu-003": CLOUD_ALONE},
            {"gpu-001": None, "gpu-002": None, "gpu-003": "admin: psu swap"},
            [LIST, VERSION, PARTITIONS, "sinfo gpu-003"],
        ),
    ],
    ids=[
        "22.05-hidden-cloud-node",
        "24.11-listed",
        "future-node",
        "nodes-all",
        "gone-from-slurm",
        "no-version",
    ],
)
async def test_every_node_with_the_hidden_ones(
    tmp_path: Path,
    version: str,
    listed: list[str],
    partitions: list[str],
    alone: dict[str, str],
    expected: dict[str, str | None],
    ran: list[str],
) -> None:
    calls = _scripted(tmp_path, listed, partitions, alone, version)
    nodes = await ScontrolScheduler(bin_dir=tmp_path).nodes()
    assert {n.name: (n.reason if n.taken_out else None) for n in nodes} == expected
    if "gpu-003" in expected:
        cloud = next(n for n in nodes if n.name == "gpu-003")
        assert {"DOWN", "CLOUD", "POWERED_DOWN"} <= cloud.states
        assert cloud.reason_user == "root"
    assert _commands(calls) == ran


def _commands(calls: Path) -> list[str]:
    """The commands run, a ``sinfo`` by the node it read alone."""
    return [
        f"sinfo {line.split(' -n ')[1].split()[0]}" if line.startswith("sinfo ") else line
        for line in calls.read_text().splitlines()
    ]


async def test_the_version_is_read_once(tmp_path: Path) -> None:
    """``scontrol --version`` once for the scheduler's life: no process a list more on 23.02 and on."""
    listed = [IDLE.format(name="gpu-001"), IDLE.format(name="gpu-002"), CLOUD_LISTED]
    calls = _scripted(tmp_path, listed, ALL3, {}, "24.11.5")
    scheduler = ScontrolScheduler(bin_dir=tmp_path)
    for _ in range(3):
        await scheduler.nodes()
    assert _commands(calls) == [LIST, VERSION, LIST, LIST]


async def test_a_hidden_node_that_cannot_be_read_fails_the_read(tmp_path: Path) -> None:
    _scripted(tmp_path, [IDLE.format(name="gpu-001"), IDLE.format(name="gpu-002")], ALL3, {})
    sinfo = tmp_path / "sinfo"
    sinfo.write_text(
        "#!/bin/sh\necho 'slurm_load_node: Unable to contact slurm controller (connect failure)' >&2\nexit 1\n"
    )
    with pytest.raises(TransientError) as caught:
        await ScontrolScheduler(bin_dir=tmp_path).nodes()
    assert caught.value.reason is Reason.UNREACHABLE
