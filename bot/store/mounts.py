"""Whether the SQLite store's file is on a filesystem other hosts may open too, or on one that
goes with the container, the pod or the boot.

SQLite's locks, and the shared memory its WAL index lives in, hold only among processes of one
host: "All processes using a database must be on the same host computer; WAL does not work over a
network filesystem" (sqlite.org/wal.html). The one-actor fence of the SQLite store (the write lock
and the lease in the same file, ``bot.store.lease``) rests on them. On a network filesystem a
second pitcrew on another host — the replacement pod a cluster starts while the first one's node is
cut off but still reaches the file server, a CLI run on a login node of an HPC site — is not fenced:
both may lead and act on the same incidents, and the file may be corrupted. An NFS-backed
``ReadWriteOnce`` volume does not prevent it: only attachable volumes are held to one node.

So the SQLite store refuses such a file (``Mount.shared``, ``refusal``), at start and in
``check-config --live``, unless ``store.allow_network_filesystem`` says nothing on another host
ever opens it. Replicas on several hosts share a Postgres store.

A file in the container's own writable layer (``overlay``: ``docker run`` without a volume, a
manifest without its claim; Kubernetes starts a new container at every restart), in memory
(``tmpfs``) or in a Kubernetes ``emptyDir`` (a manifest whose claim was swapped for one: deleted
with the pod, at a drain, an eviction or the loss of its node, just when pitcrew is needed) is
opened, but said to go with them (``Mount.ephemeral``, ``transience``): a crash would take the
incidents, and the record of what pitcrew did and may have to undo. An ``emptyDir`` on the node's
disk is a folder of the kubelet's bind-mounted into the container, on the node's own filesystem
(``ext4``, ``xfs``): it is known by that folder's path (``Mount.empty_dir``), which the mount
table gives as the mount's root.

The filesystem is read from the kernel's mount table (``/proc/self/mountinfo``, which a container
sees with its own volumes); where there is none (not Linux), nothing is said.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from bot.store.base import StoreRefused

#: The kernel's mount table of this process (proc(5), /proc/pid/mountinfo).
MOUNTINFO = Path("/proc/self/mountinfo")

#: Filesystem types (mountinfo's type field) whose files processes on other hosts may open: network
#: filesystems, the parallel filesystems of HPC sites, shared-disk cluster filesystems, and FUSE
#: clients of remote stores.
NETWORK = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "ceph",
        "lustre",
        "gpfs",
        "beegfs",
        "glusterfs",
        "ocfs2",
        "gfs2",
        "afs",
        "fuse.glusterfs",
        "fuse.ceph-fuse",
        "fuse.sshfs",
        "fuse.s3fs",
        "fuse.gcsfuse",
        "fuse.juicefs",
        "fuse.rclone",
        "fuse.beegfs",
    }
)

#: Filesystem types whose files do not outlive what mounted them: a container's own writable layer
#: (``overlay``: gone with the container, and Kubernetes starts a new container at every restart),
#: and memory (gone with what mounted it: a pod's emptyDir of medium Memory, or at the next boot).
EPHEMERAL = frozenset({"overlay", "aufs", "tmpfs", "ramfs"})

#: Where the kubelet keeps a pod's ``emptyDir`` volumes on the node's disk:
#: ``<root-dir>/pods/<pod uid>/volumes/kubernetes.io~empty-dir/<volume>`` (the volume plugin
#: ``kubernetes.io/empty-dir``, its slash written ``~``). The container sees that folder (or a
#: ``subPath`` of it) bind-mounted, and a bind mount's root in the mount table is the folder's path
#: in its filesystem: ``/var/lib/kubelet/pods/…`` on the node's root filesystem, ``/pods/…`` where
#: the kubelet's folder is a filesystem of its own. One of ``medium: Memory`` is a ``tmpfs``.
EMPTY_DIR = "/volumes/kubernetes.io~empty-dir/"

_ESCAPE = re.compile(r"\\([0-7]{3})")


class SharedFilesystem(StoreRefused):
    """The SQLite store's file is on a filesystem other hosts may open too (``shared_mount``)."""


@dataclass(frozen=True, slots=True)
class Mount:
    point: str
    fstype: str
    source: str
    #: The folder of its filesystem mounted at ``point`` (``/`` but for a bind mount).
    root: str = "/"

    @property
    def shared(self) -> bool:
        return self.fstype in NETWORK

    @property
    def empty_dir(self) -> bool:
        """A Kubernetes ``emptyDir`` on the node's disk (``EMPTY_DIR``)."""
        return EMPTY_DIR in self.root

    @property
    def ephemeral(self) -> bool:
        return self.fstype in EPHEMERAL or self.empty_dir


def _unescape(field: str) -> str:
    """A mountinfo path field: the kernel writes space, tab, newline and backslash as octal escapes."""
    return _ESCAPE.sub(lambda found: chr(int(found.group(1), 8)), field)


def parse(text: str) -> list[Mount]:
    """The mounts of a mountinfo table, in its order (a later mount over the same point hides an
    earlier one). A line: id, parent, major:minor, root, mount point, options, optional fields,
    ``-``, type, source, super options."""
    mounts = []
    for line in text.splitlines():
        fields = line.split(" ")
        if len(fields) < 10 or "-" not in fields[6:]:
            continue  # not a mount line
        after = fields.index("-", 6)
        if len(fields) < after + 3:
            continue
        point, root = _unescape(fields[4]), _unescape(fields[3])
        mounts.append(Mount(point, fields[after + 1], _unescape(fields[after + 2]), root))
    return mounts


def mount_of(path: str, mounts: Iterable[Mount]) -> Mount | None:
    """The mount an absolute, resolved ``path`` is on: the deepest mount point above it, the last
    mounted of those at the same point."""
    found: Mount | None = None
    for mount in mounts:
        point = mount.point
        above = path == point or path.startswith(point.rstrip("/") + "/")
        if above and (found is None or len(point) >= len(found.point)):
            found = mount
    return found


def _existing(path: Path) -> Path:
    """``path`` resolved, or its nearest folder that exists (the store's file is created at start)."""
    here = Path(os.path.abspath(path))
    while not here.exists() and here != here.parent:
        here = here.parent
    return here.resolve()


def filesystem(path: Path, table: Path = MOUNTINFO) -> Mount | None:
    """The mount ``path`` is (or will be created) on; ``None`` where the table cannot be read."""
    try:
        text = table.read_text(errors="replace")
    except OSError:
        return None
    return mount_of(str(_existing(path)), parse(text))


def refusal(path: Path, mount: Mount) -> str:
    """Why the SQLite store must not be opened at ``path``, on ``mount`` (``Mount.shared``), unless
    ``store.allow_network_filesystem`` says so."""
    return (
        f"{path} is on {mount.fstype} ({mount.source} at {mount.point}), a filesystem other hosts "
        "may open too: SQLite's locks and its WAL hold only among processes of one host, so a "
        "pitcrew on another host (a replacement pod while this one's node is cut off) would not be "
        "fenced and could act on the same incidents twice. Put store.path on a local or block "
        "volume, or use Postgres (store.url) to run on several hosts; set "
        "store.allow_network_filesystem: true only if nothing on another host ever opens this file"
    )


def allowance(mount: Mount) -> str:
    """What is said of a store opened on ``mount`` because the setting allows it."""
    return (
        f"on {mount.fstype} ({mount.source}), which other hosts may open too: allowed by "
        "store.allow_network_filesystem, so nothing on another host may ever open it"
    )


def transience(mount: Mount) -> str:
    """What is said (a warning at start, ``check-config --live``) of a store on ``mount``
    (``Mount.ephemeral``): it is opened, since a demo or a test may want just that, but a service's
    incidents, and its record of what it did and may have to undo, would be lost."""
    if mount.empty_dir:
        return (
            f"on a Kubernetes emptyDir ({mount.fstype} on {mount.source}), whose files are gone with "
            "this pod (deleted with it: at a drain, an eviction, the loss of its node): the incidents, "
            "and the record of what pitcrew did and may have to undo, with them; put store.path on a "
            "PersistentVolumeClaim"
        )
    gone = (
        "with what mounted this memory (the pod, for an emptyDir of medium Memory), at the next boot at the latest"
        if mount.fstype in {"tmpfs", "ramfs"}
        else "with this container, at every restart"
    )
    return (
        f"on {mount.fstype} ({mount.source}), whose files are gone {gone}: the incidents, and the "
        "record of what pitcrew did and may have to undo, with them; put store.path on a volume"
    )
