"""Which mount a path is on, read from mount tables as the kernel writes them
(``tests/fixtures/mounts``), and which filesystems other hosts may open too (``bot.store.mounts``)."""

from __future__ import annotations

import pytest

from bot.store.mounts import Mount, mount_of, parse, transience
from tests.conftest import FIXTURES

TABLES = FIXTURES / "mounts"


def _table(name: str) -> list[Mount]:
    return parse((TABLES / name).read_text())


@pytest.mark.parametrize(
    ("table", "path", "point", "fstype", "shared", "ephemeral"),
    [
        # The pod: the store's volume is an NFS PersistentVolume, the rest is the node's or the pod's.
        ("pod-nfs-pvc.txt", "/var/lib/pitcrew/pitcrew.db", "/var/lib/pitcrew", "nfs4", True, False),
        ("pod-nfs-pvc.txt", "/var/lib/pitcrew", "/var/lib/pitcrew", "nfs4", True, False),
        ("pod-nfs-pvc.txt", "/var/lib/pitcrew-old/pitcrew.db", "/", "overlay", False, True),
        ("pod-nfs-pvc.txt", "/tmp/pitcrew.db", "/tmp", "tmpfs", False, True),
        ("pod-nfs-pvc.txt", "/etc/hosts", "/etc/hosts", "ext4", False, False),
        ("pod-nfs-pvc.txt", "/", "/", "overlay", False, True),
        # The head node: the parallel filesystems of an HPC site.
        ("hpc-head-node.txt", "/home/alice/.local/state/pitcrew/pitcrew.db", "/home", "gpfs", True, False),
        ("hpc-head-node.txt", "/lustre/scratch/pitcrew.db", "/lustre/scratch", "lustre", True, False),
        ("hpc-head-node.txt", "/lustre/scratchy/pitcrew.db", "/", "ext4", False, False),
        # Mounted over twice: the last one mounted is the one seen.
        ("hpc-head-node.txt", "/var/lib/pitcrew/pitcrew.db", "/var/lib", "xfs", False, False),
        # Octal escapes in the mount point; a sibling whose name it begins with is another mount.
        ("hpc-head-node.txt", "/srv/pitcrew state/pitcrew.db", "/srv/pitcrew state", "nfs", True, False),
        ("hpc-head-node.txt", "/srv/pitcrew/pitcrew.db", "/srv/pitcrew", "ext4", False, False),
        # A pod's emptyDir on the node's disk: the node's filesystem, known by the kubelet's folder.
        ("pod-emptydir.txt", "/var/lib/pitcrew/pitcrew.db", "/var/lib/pitcrew", "ext4", False, True),
        ("pod-emptydir.txt", "/var/lib/pitcrew-sub/pitcrew.db", "/var/lib/pitcrew-sub", "ext4", False, True),
        ("pod-emptydir.txt", "/scratch/pitcrew.db", "/scratch", "xfs", False, True),
        ("pod-emptydir.txt", "/cache/pitcrew.db", "/cache", "tmpfs", False, True),
        # A claim's volume, a hostPath and the kubelet's own files into the container are no emptyDir.
        ("pod-emptydir.txt", "/var/lib/pitcrew-pvc/pitcrew.db", "/var/lib/pitcrew-pvc", "ext4", False, False),
        (
            "pod-emptydir.txt",
            "/var/lib/pitcrew-host/pitcrew.db",
            "/var/lib/pitcrew-host",
            "ext4",
            False,
            False,
        ),
        ("pod-emptydir.txt", "/etc/hosts", "/etc/hosts", "ext4", False, False),
    ],
)
def test_the_mount_a_path_is_on(
    table: str, path: str, point: str, fstype: str, shared: bool, ephemeral: bool
) -> None:
    """``ephemeral``: the container's own layer, or memory; files there go with the container or
    the boot (said at start and by check-config --live, never refused)."""
    mount = mount_of(path, _table(table))
    assert mount is not None
    assert (mount.point, mount.fstype, mount.shared, mount.ephemeral) == (point, fstype, shared, ephemeral)


def test_an_empty_dir_is_told_from_its_root_and_said_to_go_with_the_pod() -> None:
    mounts = {m.point: m for m in _table("pod-emptydir.txt")}
    volume = mounts["/var/lib/pitcrew"]
    assert volume.root.endswith("/volumes/kubernetes.io~empty-dir/state") and volume.empty_dir
    said = transience(volume)
    assert said.startswith("on a Kubernetes emptyDir (ext4 on /dev/nvme0n1p1)"), said
    assert "gone with this pod" in said and "PersistentVolumeClaim" in said
    assert not mounts["/cache"].empty_dir and "the pod, for an emptyDir of medium Memory" in transience(
        mounts["/cache"]
    )
    assert {m.root for m in _table("pod-nfs-pvc.txt") if m.point == "/var/lib/pitcrew"} == {"/"}


def test_a_source_is_read_whole_and_unescaped() -> None:
    mounts = {m.point: m for m in _table("hpc-head-node.txt")}
    assert mounts["/srv/pitcrew state"].source == "nas02:/exports/pitcrew state"
    assert mounts["/lustre/scratch"].source == "10.2.0.1@o2ib:/scratch"
    assert {m.point: m.source for m in _table("pod-nfs-pvc.txt")}["/var/lib/pitcrew"] == (
        "10.0.12.5:/export/pvc-8d2c41b7-0e5f-4b1b-9a0c-2f0c3c6e9f15"
    )


@pytest.mark.parametrize(
    "line",
    [
        "",
        "not a mount table",
        "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 ext3 /dev/root rw",  # no separator
        "36 35 98:0 /mnt1 /mnt2 rw - ext3",  # no source
    ],
)
def test_lines_that_are_no_mount_are_passed_over(line: str) -> None:
    assert parse(line) == []
    assert mount_of("/mnt2/x", parse(line)) is None


def test_optional_fields_may_be_many_or_none() -> None:
    text = (
        "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 shared:4 propagate_from:2 - nfs srv:/a rw\n"
        "37 35 98:1 / /mnt3 rw - ext4 /dev/sdb rw\n"
    )
    assert [(m.point, m.fstype, m.source) for m in parse(text)] == [
        ("/mnt2", "nfs", "srv:/a"),
        ("/mnt3", "ext4", "/dev/sdb"),
    ]
