"""Pod Security admission as the API server enforces it on pod creation, from the namespace's labels.

Only ``pod-security.kubernetes.io/enforce`` refuses anything, and only pods: a Job (or any workload)
in a restricted namespace is created, and its controller's pod is refused. A namespace without the
label (or no Namespace object at all) is ``privileged``, the API server's default admission
configuration. The checks are the Pod Security Standards' baseline and restricted controls that a
node-repair Job trips (privileged, host namespaces, hostPath, added capabilities; privilege
escalation, non-root, dropped capabilities, seccomp); the message is the admission plugin's.
"""

from __future__ import annotations

from typing import Any

ENFORCE = "pod-security.kubernetes.io/enforce"
LEVELS = ("privileged", "baseline", "restricted")
#: Capabilities the baseline level lets a container add.
_BASELINE_CAPS = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
    "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}  # fmt: skip


def level_of(namespace: dict[str, Any] | None) -> str:
    labels = ((namespace or {}).get("metadata") or {}).get("labels") or {}
    level = labels.get(ENFORCE, "privileged")
    return level if level in LEVELS else "restricted"  # an unknown level is treated as the strictest


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]


def _baseline(spec: dict[str, Any]) -> list[str]:
    found = []
    privileged = [c["name"] for c in _containers(spec) if (c.get("securityContext") or {}).get("privileged")]
    if privileged:
        found.append(f"privileged ({_names(privileged)} must not set securityContext.privileged=true)")
    hosts = [f"{k}=true" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    if hosts:
        found.append(f"host namespaces ({', '.join(hosts)})")
    paths = [v["name"] for v in spec.get("volumes") or [] if "hostPath" in v]
    if paths:
        found.append(f"hostPath volumes ({'volume' if len(paths) == 1 else 'volumes'} {_quoted(paths)})")
    added = [
        (c["name"], cap)
        for c in _containers(spec)
        for cap in ((c.get("securityContext") or {}).get("capabilities") or {}).get("add") or []
        if cap not in _BASELINE_CAPS
    ]
    if added:
        caps = _quoted(sorted({cap for _, cap in added}))
        found.append(f"capabilities ({_names(sorted({n for n, _ in added}))} must not include {caps} in "
                     "securityContext.capabilities.add)")  # fmt: skip
    return found


def _restricted(spec: dict[str, Any]) -> list[str]:
    found = []
    pod_sc = spec.get("securityContext") or {}
    containers = _containers(spec)
    escalation = [
        c["name"]
        for c in containers
        if (c.get("securityContext") or {}).get("allowPrivilegeEscalation") is not False
    ]
    if escalation:
        found.append(
            f"allowPrivilegeEscalation != false ({_names(escalation)} must set "
            "securityContext.allowPrivilegeEscalation=false)"
        )
    caps = [
        c["name"]
        for c in containers
        if "ALL" not in (((c.get("securityContext") or {}).get("capabilities") or {}).get("drop") or [])
    ]
    if caps:
        found.append(
            f'unrestricted capabilities ({_names(caps)} must set securityContext.capabilities.drop=["ALL"])'
        )
    root = [
        c["name"]
        for c in containers
        if (c.get("securityContext") or {}).get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is not True
    ]
    if root:
        found.append(
            f"runAsNonRoot != true (pod or {_names(root)} must set securityContext.runAsNonRoot=true)"
        )
    seccomp = [
        c["name"]
        for c in containers
        if ((c.get("securityContext") or {}).get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get(
            "type"
        )
        not in ("RuntimeDefault", "Localhost")
    ]
    if seccomp:
        found.append(
            f"seccompProfile (pod or {_names(seccomp)} must set securityContext.seccompProfile.type to "
            '"RuntimeDefault" or "Localhost")'
        )
    return found


def violations(level: str, pod_spec: dict[str, Any]) -> list[str]:
    """What ``pod_spec`` breaks at ``level`` (empty: admitted)."""
    if level == "privileged":
        return []
    found = _baseline(pod_spec)
    if level == "restricted":
        found += _restricted(pod_spec)
    return found


def forbidden_message(name: str, level: str, found: list[str]) -> str:
    return f'pods "{name}" is forbidden: violates PodSecurity "{level}:latest": {", ".join(found)}'


def _names(names: list[str]) -> str:
    return f"container {_quoted(names)}" if len(names) == 1 else f"containers {_quoted(names)}"


def _quoted(items: list[str]) -> str:
    return ", ".join(f'"{i}"' for i in items)
