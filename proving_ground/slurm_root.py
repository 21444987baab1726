"""Which Slurm the proving ground runs: Debian 12's own (22.05), 24.11 from a Debian 13 root, or
26.05 from a Debian unstable root.

Clusters today run Slurm 23.11 to 26.05 while this machine's packages give 22.05. A newer Slurm
runs beside it from a root made by ``debootstrap`` (``scripts/setup`` makes 24.11's once, and
26.05's when ``PITCREW_SLURM_ROOTS`` names it, under ``$PROVING_GROUND_SLURM_ROOTS``, default
``/var/cache/pitcrew``; see ``../shared/notes/slurm.md``).

``SlurmRoot`` owns the mounts such a root needs, and nothing else: one process holds a private
mount namespace in which ``/proc``, ``/dev`` and the cluster's run directory (at the same path
inside as outside, so slurm.conf, the checkpoints and the progress files mean the same thing on
both sides) are mounted under the root. Every daemon and command enters that namespace and
chroots. The mounts belong to the namespace, not to the machine: they vanish with the last
process inside it, so a killed test never leaves ``/dev`` mounted under the cache. ``stop``
still kills whatever runs inside the root (found by ``readlink /proc/PID/root``) and removes
the mount point it made.

The wrappers ``bin/scontrol``, ``bin/squeue`` … in the run directory are how pitcrew, which
knows nothing of chroots, runs that Slurm's client (``slurm.bin_dir``).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

from proving_ground.proc import DemoError, stop_process

VERSIONS = ("22.05", "24.11", "26.05")
#: What the tests marked ``every_slurm`` run on unless one is chosen (CI makes no 26.05 root: its
#: shapes are table-tested from captures, ``tests/fixtures/slurm/26.05``; ``--slurm all`` runs it).
EVERY = ("22.05", "24.11")
DEFAULT_VERSION = "22.05"
#: the Slurm the proving ground starts when nobody chooses (``--slurm``, ``PROVING_GROUND_SLURM``)
VERSION_ENV = "PROVING_GROUND_SLURM"
ROOTS_ENV = "PROVING_GROUND_SLURM_ROOTS"
CLIENTS = ("scontrol", "squeue", "sinfo", "sbatch", "scancel")


def chosen_version(value: str | None = None) -> str:
    """``value``, else ``$PROVING_GROUND_SLURM``, else 22.05; ``DemoError`` for a version we cannot run."""
    version = value or os.environ.get(VERSION_ENV) or DEFAULT_VERSION
    if version not in VERSIONS:
        raise DemoError(
            f"Slurm {version} is not one the proving ground runs: choose one of {', '.join(VERSIONS)}"
        )
    return version


def roots() -> Path:
    """Where ``scripts/setup`` makes its Debian roots (Slurm's and PostgreSQL's): ``$PROVING_GROUND_SLURM_ROOTS``."""
    return Path(os.environ.get(ROOTS_ENV) or "/var/cache/pitcrew")


def root_path(version: str) -> Path | None:
    """Where the root of ``version`` lives; ``None`` for the machine's own Slurm."""
    if version == DEFAULT_VERSION:
        return None
    return roots() / f"slurm-{version}"


def root_missing(version: str) -> str | None:
    """Why ``version`` cannot start here (and how to fix it), or ``None``."""
    root = root_path(version)
    if root is None:
        return None
    if not (root / "usr" / "sbin" / "slurmctld").exists() or not (root / "usr" / "bin" / "python3").exists():
        asked = "" if version == "24.11" else f' with PITCREW_SLURM_ROOTS="{version}"'
        return (
            f"no Slurm {version} root at {root}: run scripts/setup as root{asked} to make it "
            f"(${ROOTS_ENV} moves it)"
        )
    return None


class SlurmRoot:
    """The mount namespace and chroot one cluster's daemons and commands run in."""

    def __init__(self, root: Path, run_dir: Path) -> None:
        self.root = root
        self.run_dir = run_dir
        self.bin_dir = run_dir / "bin"
        self._mount_point = root / str(run_dir).lstrip("/")
        self._holder: subprocess.Popen[bytes] | None = None
        self._namespace: str | None = None
        self._made: list[Path] = []  # directories made in the root for the mount point, deepest first

    def start(self) -> None:
        """Make the namespace with its mounts and the client wrappers."""
        self._made = [p for p in (self._mount_point, *self._mount_point.parents) if not p.exists()]
        self._mount_point.mkdir(parents=True, exist_ok=True)
        mounts = " && ".join(
            [
                f"mount -t proc proc {shlex.quote(str(self.root / 'proc'))}",
                f"mount --rbind /dev {shlex.quote(str(self.root / 'dev'))}",
                f"mount --bind {shlex.quote(str(self.run_dir))} {shlex.quote(str(self._mount_point))}",
                "echo ready",
                # Held while whoever started the cluster lives: a killed demo or test leaves no
                # namespace behind once its daemons are gone too.
                'exec sh -c "while kill -0 $PPID 2>/dev/null; do sleep 1; done"',
            ]
        )
        self._holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", mounts],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        assert self._holder.stdout is not None
        if self._holder.stdout.readline().strip() != b"ready":
            err = self._holder.stderr.read().decode(errors="replace") if self._holder.stderr else ""
            self.stop()
            raise DemoError(f"could not mount {self.root} for Slurm: {err.strip()}")
        self._namespace = os.readlink(f"/proc/{self._holder.pid}/ns/mnt")
        self.bin_dir.mkdir(exist_ok=True)
        for client in CLIENTS:
            wrapper = self.bin_dir / client
            wrapper.write_text(
                "#!/bin/sh\n# The Slurm client of the chroot the proving ground runs (proving_ground.slurm_root).\n"
                f'exec {shlex.join(self.command(f"/usr/bin/{client}"))} "$@"\n'
            )
            wrapper.chmod(0o755)

    def command(self, *argv: str) -> list[str]:
        """``argv`` run inside the root (in its namespace)."""
        if self._holder is None:
            raise DemoError("the Slurm root is not started")
        return ["nsenter", f"--target={self._holder.pid}", "--mount", "--", "chroot", str(self.root), *argv]

    def inside(self) -> list[int]:
        """This cluster's processes inside the root (daemons, job steps, stray commands): their root
        directory is the root, and they are in this cluster's namespace or name its run directory
        (another cluster may run from the same root at the same time)."""
        marker = str(self.run_dir).encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                if os.readlink(entry / "root") != str(self.root):
                    continue
                blob = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
                if os.readlink(entry / "ns" / "mnt") == self._namespace or marker in blob:
                    found.append(int(entry.name))
        return found

    def stop(self, grace: float = 5) -> list[int]:
        """Kill what still runs inside, end the namespace, remove the mount point; the killed pids."""
        survivors = self.inside()
        for pid in survivors:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + grace
        while self.inside() and time.monotonic() < deadline:
            time.sleep(0.05)
        if self._holder is not None:
            stop_process(self._holder, timeout=grace)
            for pipe in (self._holder.stdout, self._holder.stderr):
                if pipe is not None:
                    pipe.close()
            self._holder = None
        for made in self._made:  # empty once the namespace is gone
            with contextlib.suppress(OSError):
                made.rmdir()
        return survivors
