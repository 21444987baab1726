"""The SQLite store on a filesystem other hosts may open too (``bot.store.mounts``): refused at
open and said by ``check-config --live``'s inspection, nothing created; opened when
``store.allow_network_filesystem`` says nothing on another host opens it; and a store that refuses
to open stops ``pitcrew`` with one line, not a traceback. A store in the container's own writable
layer opens, and is said (a warning, ``check-config --live``) to go with the container.

No network filesystem can be mounted here, so the mount table is the kernel's own with one line
added: the test's folder mounted over NFS, as a pod sees an NFS PersistentVolume
(``tests/fixtures/mounts``). The kernel's table alone says the test's folder is local.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bot.cli import main
from bot.domain.faults import Fault
from bot.store.base import Delivery, IncomingAlert
from bot.store.mounts import MOUNTINFO, SharedFilesystem, filesystem
from bot.store.schema import SCHEMA_VERSION
from bot.store.sqlite import SqliteStore
from proving_ground.proc import free_port
from tests.harness.stores import newer_schema

T0 = datetime(2026, 12, 4, 9, 0, tzinfo=UTC)


def _table_with(tmp_path: Path, line: str) -> Path:
    """The kernel's mount table, and ``line`` mounted after everything else."""
    table = tmp_path / "mountinfo"
    table.write_text(MOUNTINFO.read_text() + line + "\n")
    return table


def _nfs_table(tmp_path: Path, point: Path) -> Path:
    """``point`` mounted over NFS."""
    return _table_with(
        tmp_path,
        f"9999 1 0:999 / {point} rw,relatime - nfs4 10.0.12.5:/export/pvc-1 rw,vers=4.1,hard,proto=tcp",
    )


def _overlay_table(tmp_path: Path, point: Path) -> Path:
    """``point`` a container's own writable layer (containerd's)."""
    return _table_with(
        tmp_path,
        f"9998 1 0:312 / {point} rw,relatime - overlay overlay rw,lowerdir=/var/lib/containerd/"
        "io.containerd.snapshotter.v1.overlayfs/snapshots/912/fs,upperdir=/var/lib/containerd/"
        "io.containerd.snapshotter.v1.overlayfs/snapshots/1071/fs",
    )


async def _opens_stores_and_warns(
    store: SqliteStore, caplog: pytest.LogCaptureFixture, words: str, filesystem: str
) -> None:
    """The store opens and stores a delivery; its start warned once, naming the filesystem."""
    await store.open()
    try:
        assert (await store.ingest(_delivery(), T0)).opened == ["pc-00001"]
    finally:
        await store.close()
    [warned] = [r for r in caplog.records if words in r.getMessage()]
    assert (warned.levelno, getattr(warned, "filesystem", None)) == (logging.WARNING, filesystem)


def _delivery() -> Delivery:
    fault = Fault(
        "xid", "gpu-001", "3", 79, "RESTART_BM", "fatal", "replace-node", True, "fell off the bus", True
    )
    alert = IncomingAlert("fp-1", T0, None, "firing", "GpuXid", "gpu-001", {"node": "gpu-001"}, {}, fault)
    return Delivery("pitcrew", "{}:{node=gpu-001}", "firing", 0, (alert,))


def test_the_kernel_s_table_says_where_the_test_s_folder_is() -> None:
    mount = filesystem(Path(__file__).parent)
    assert mount is not None
    assert str(Path(__file__).resolve()).startswith(mount.point)


@pytest.mark.parametrize("below", ["pitcrew.db", "state/sub/pitcrew.db"], ids=["file", "folders-to-create"])
async def test_a_store_on_a_network_filesystem_is_refused_and_nothing_is_created(
    tmp_path: Path, below: str
) -> None:
    volume = tmp_path / "volume"
    volume.mkdir()
    path = volume / below
    store = SqliteStore(path, mount_table=_nfs_table(tmp_path, volume))
    seen = await store.inspect()
    assert not seen.ok
    assert "nfs4 (10.0.12.5:/export/pvc-1 at " in seen.detail
    assert seen.missing == ("a local filesystem for store.path (or a Postgres store)",)
    with pytest.raises(SharedFilesystem, match="could act on the same incidents twice") as refused:
        await store.open()
    assert "store.allow_network_filesystem" in str(refused.value)
    assert "store.url" in str(refused.value)
    await store.close()
    assert list(volume.iterdir()) == []  # no database, no WAL, no folder


async def test_a_store_allowed_on_a_network_filesystem_opens_and_stores_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    volume = tmp_path / "volume"
    volume.mkdir()
    store = SqliteStore(
        volume / "pitcrew.db", mount_table=_nfs_table(tmp_path, volume), network_filesystem=True
    )
    seen = await store.inspect()
    assert seen.ok and "on nfs4 (10.0.12.5:/export/pvc-1)" in seen.detail
    assert "allowed by store.allow_network_filesystem" in seen.detail
    await _opens_stores_and_warns(store, caplog, "allowed by store.allow_network_filesystem", "nfs4")
    again = await store.inspect()  # the file made: its schema said, and where it is
    assert again.ok and "allowed by store.allow_network_filesystem" in again.detail


async def test_a_local_folder_beside_the_network_mount_is_not_refused(tmp_path: Path) -> None:
    volume, local = tmp_path / "volume", tmp_path / "volume-local"
    volume.mkdir()
    local.mkdir()
    store = SqliteStore(local / "pitcrew.db", mount_table=_nfs_table(tmp_path, volume))
    await store.open()
    await store.close()
    assert (local / "pitcrew.db").exists()


def _newer_than_this_pitcrew(path: Path) -> None:
    """A store a newer pitcrew migrated with a migration this one must not run after."""
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        for statement in newer_schema(True, SCHEMA_VERSION + 1, SCHEMA_VERSION + 1):
            conn.execute(statement)


def test_a_store_that_refuses_to_open_stops_pitcrew_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "pitcrew.db"
    store = SqliteStore(path)
    asyncio.run(store.open())
    asyncio.run(store.close())
    _newer_than_this_pitcrew(path)
    monkeypatch.setenv("PITCREW_STORE__PATH", str(path))
    # A read command, in process.
    assert main(["incidents"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("pitcrew: ") and "newer than this pitcrew" in err, err
    assert "Traceback" not in err
    # The service, as a process: it stops at start, one line, exit 1.
    done = subprocess.run(
        [sys.executable, "-m", "bot.cli", "serve", "--listen", f"127.0.0.1:{free_port()}"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PITCREW_STORE__PATH": str(path), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "pitcrew: " in done.stderr and "newer than this pitcrew" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr


async def test_a_store_in_the_container_s_own_layer_opens_and_says_it_will_not_outlive_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``docker run`` without a volume, or a manifest without its PersistentVolumeClaim: the store
    is in the container's writable layer, and Kubernetes starts a new container at every restart.
    It opened without a word, and every crash took the incidents with it, and with them the record
    of what pitcrew did and may have to undo. Opened still (a demo may want just that), said at
    start and by ``check-config --live``."""
    layer = tmp_path / "layer"
    layer.mkdir()
    store = SqliteStore(layer / "pitcrew.db", mount_table=_overlay_table(tmp_path, layer))
    seen = await store.inspect()
    assert seen.ok and "on overlay (overlay), whose files are gone with this container" in seen.detail, seen
    assert "put store.path on a volume" in seen.detail
    await _opens_stores_and_warns(store, caplog, "put store.path on a volume", "overlay")
    # A volume mounted there (here: the kernel's own table) is said nothing of.
    assert "whose files are gone" not in (await SqliteStore(layer / "pitcrew.db").inspect()).detail


async def test_a_store_in_an_empty_dir_opens_and_says_it_goes_with_the_pod(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A manifest whose claim was swapped for an ``emptyDir`` (no storage class at hand): the
    store is on the node's own disk, so it passed for a volume, and it is deleted with the pod, at
    a drain, an eviction or the loss of the node, just when pitcrew is needed. Known by the
    kubelet's folder the mount comes from; opened still, said at start and by ``check-config --live``."""
    volume = tmp_path / "state"
    volume.mkdir()
    table = _table_with(
        tmp_path,
        f"9997 1 259:1 /var/lib/kubelet/pods/9b1e7a52/volumes/kubernetes.io~empty-dir/state {volume}"
        " rw,relatime - ext4 /dev/nvme0n1p1 rw",
    )
    store = SqliteStore(volume / "pitcrew.db", mount_table=table)
    seen = await store.inspect()
    assert seen.ok and "on a Kubernetes emptyDir (ext4 on /dev/nvme0n1p1)" in seen.detail, seen
    assert "gone with this pod" in seen.detail
    await _opens_stores_and_warns(store, caplog, "put store.path on a PersistentVolumeClaim", "ext4")
