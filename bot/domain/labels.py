"""Label normalisation: the one place that knows how node, GPU and XID are spelled.

dcgm-exporter renamed ``Hostname`` to ``hostname`` in 4.6.0, rule sets put the node in
``node``, ``kubernetes_node`` or only in ``instance``, and XIDs arrive as ``xid``,
``err_code`` or in the alert value. Everything downstream reads a ``Subject`` built here,
never raw labels. ``LabelRules`` is also the ``labels`` configuration section as it is.

A node is a Kubernetes node name (a lower-case RFC 1123 subdomain): ``GPU-NODE-07`` is
``gpu-node-07``, so one node is one node to the "one active incident per node" rule, and a
value that is no node name (``../../etc/passwd``, ``gpu-node-0[1-9]``, a zero-width space)
is refused with the alert and the label named, never guessed at. An XID is ASCII digits.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from bot.domain.alerts import Alert, AlertRejected, WebhookPayload
from bot.domain.nvlink5 import KernelLine, kernel_line

DEFAULT_NODE_LABELS = ("node", "kubernetes_node", "Hostname", "hostname", "instance")
DEFAULT_GPU_LABELS = ("gpu", "UUID", "pci_bus_id")
DEFAULT_XID_LABELS = ("xid", "err_code")
#: Annotations consulted when the rule put the XID in the alert value (``{{ $value }}``).
DEFAULT_XID_ANNOTATIONS = ("xid", "value")

#: Kubernetes' IsDNS1123Subdomain, which node names must pass.
_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_NODE_NAME_MAX = 253
#: Spacing a template may leave around a value; any other character is part of the value.
_SPACE = " \t\r\n"
#: An XID: ASCII digits (``float()`` reads ``7_9``, ``7.9e1`` and Arabic-Indic or full-width 79 as 79), or
#: digits and a fraction of zeros, which is how a rule that prints the sample value with
#: ``printf "%f"`` renders a whole number (``79.000000``): the same number, nothing rounded.
_XID = re.compile(r"([0-9]{1,6})(?:\.0+)?")


class LabelRules(BaseModel):
    """Ordered label names to look up; the first non-empty one wins."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node: tuple[str, ...] = Field(
        default=DEFAULT_NODE_LABELS, description="Where the node name is; `instance` loses its port."
    )
    gpu: tuple[str, ...] = Field(default=DEFAULT_GPU_LABELS, description="Where the GPU is.")
    xid: tuple[str, ...] = Field(default=DEFAULT_XID_LABELS, description="Where the XID is.")
    xid_annotations: tuple[str, ...] = Field(
        default=DEFAULT_XID_ANNOTATIONS,
        description="Annotations holding the XID when a rule put $value there.",
    )


@dataclass(frozen=True, slots=True)
class Subject:
    """What one alert is about, in pitcrew's terms.

    ``xid`` is ``None`` when the alert carries none; ``xid_text`` keeps a value that was
    present but not a number, so the fault can say so instead of guessing.
    """

    node: str | None
    gpu: str | None
    gpu_uuid: str | None
    pci_bus_id: str | None
    xid: int | None
    xid_text: str | None
    fault_label: str | None
    message: str
    recovery_action: str | None = None
    #: The network port an alert names (node-exporter's ``device`` and ``port`` labels):
    #: ``mlx5_0 port 1``, or ``ens1f0`` for an interface.
    link: str | None = None
    #: The driver's ``NVRM: Xid`` line, when the alert carries one (a kernel-log rule puts it in a
    #: label or annotation; dcgm-exporter's ``err_msg`` is a fixed text per XID and never does).
    xid_line: KernelLine | None = None


#: Where an alert may carry the driver's kernel line, in the order they are read.
XID_LINE_LABELS = ("err_msg", "message", "kernel_message")
XID_LINE_ANNOTATIONS = ("message", "kernel_message", "description", "summary")


def host_part(instance: str) -> str:
    """``10.0.0.5:9400`` → ``10.0.0.5``; ``[fd00::1]:9400`` → ``fd00::1``; ``node-7`` → ``node-7``."""
    if instance.startswith("["):
        end = instance.find("]")
        return instance[1:end] if end > 0 else instance
    if instance.count(":") == 1:
        return instance.split(":", 1)[0]
    return instance


def node_name(value: str) -> str:
    """``GPU-Node-07`` → ``gpu-node-07``; ``ValueError`` saying why when ``value`` is no node name."""
    # ASCII first: str.lower() maps some non-ASCII letters to ASCII ones (KELVIN SIGN → "k").
    if not value.isascii():
        raise ValueError("has characters outside ASCII; a node name is a-z, 0-9, '-' and '.'")
    name = value.lower()
    if len(name) > _NODE_NAME_MAX:
        raise ValueError(f"is longer than {_NODE_NAME_MAX} characters, the most a node name has")
    if _NODE_NAME.fullmatch(name) is None:
        raise ValueError(
            "is not a Kubernetes node name (a lower-case RFC 1123 subdomain: a-z, 0-9, '-' and '.',"
            " starting and ending with a letter or digit)"
        )
    return name


class LabelError(ValueError):
    """A label pitcrew reads holds a value it refuses; ``str()`` names the label and says why."""


DEFAULT_LABEL_RULES = LabelRules()


def subjects_of(payload: WebhookPayload, rules: LabelRules = DEFAULT_LABEL_RULES) -> list[Subject]:
    """One ``Subject`` per alert, or ``AlertRejected`` naming every alert with a refused label."""
    subjects, problems = [], []
    for index, alert in enumerate(payload.alerts):
        try:
            subjects.append(subject_of(alert, rules))
        except LabelError as exc:
            problems.append((index, alert, str(exc)))
    if problems:
        raise AlertRejected.of(problems)
    return subjects


def subject_of(alert: Alert, rules: LabelRules = DEFAULT_LABEL_RULES) -> Subject:
    """What ``alert`` is about; ``LabelError`` when the label naming its node holds no node name."""
    labels = alert.labels
    node = None
    for name in rules.node:
        value = labels.get(name, "").strip(_SPACE)
        if value:
            node = _node_from(name, value)
            break
    gpu = next((labels[n].strip() for n in rules.gpu if labels.get(n, "").strip()), None)
    xid_text = next((labels[n].strip(_SPACE) for n in rules.xid if labels.get(n, "").strip(_SPACE)), None)
    if xid_text is None and _looks_like_xid_alert(alert):
        xid_text = next(
            (
                alert.annotations[n].strip(_SPACE)
                for n in rules.xid_annotations
                if alert.annotations.get(n, "").strip(_SPACE)
            ),
            None,
        )
    return Subject(
        node=node,
        gpu=gpu,
        gpu_uuid=labels.get("UUID") or labels.get("uuid") or None,
        pci_bus_id=labels.get("pci_bus_id") or None,
        xid=_parse_xid(xid_text),
        xid_text=xid_text,
        fault_label=labels.get("fault") or None,
        message=labels.get("err_msg")
        or alert.annotations.get("description", "")
        or alert.annotations.get("summary", ""),
        recovery_action=labels.get("recovery_action") or None,
        link=_link(labels.get("device", ""), labels.get("port", "")),
        xid_line=_xid_line(alert),
    )


def _xid_line(alert: Alert) -> KernelLine | None:
    texts = [alert.labels.get(n, "") for n in XID_LINE_LABELS]
    texts += [alert.annotations.get(n, "") for n in XID_LINE_ANNOTATIONS]
    return next((line for line in map(kernel_line, texts) if line is not None), None)


#: A device or port name as node-exporter reports one (sysfs names); anything else is not shown.
_LINK_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")


def _link(device: str, port: str) -> str | None:
    """``mlx5_0 port 1`` from node-exporter's labels; ``None`` when they name no port. The value
    ends up in a Slurm reason: only names that look like a device's are taken."""
    device, port = device.strip(_SPACE), port.strip(_SPACE)
    if not _LINK_PART.fullmatch(device):
        return None
    return f"{device} port {port}" if _LINK_PART.fullmatch(port) else device


def _node_from(label: str, value: str) -> str:
    host = host_part(value) if label == "instance" else value
    try:
        return node_name(host)
    except ValueError as exc:
        what = f"label {label} {_shown(value)}" + (f": host {_shown(host)}" if host != value else "")
        raise LabelError(f"{what} {exc}") from None


def _shown(value: str, limit: int = 64) -> str:
    """A label value quoted for a message: escapes make invisible characters visible."""
    return repr(value) if len(value) <= limit else f"{value[: limit - 3]!r}..."


def _looks_like_xid_alert(alert: Alert) -> bool:
    fault = alert.labels.get("fault", "")
    return fault.startswith("xid") or "xid" in alert.alertname.lower()


def _parse_xid(text: str | None) -> int | None:
    """The XID in ``text`` (already stripped of spacing), or ``None``: unknown, a human decides."""
    match = _XID.fullmatch(text) if text is not None else None
    if match is None:
        return None
    value = int(match.group(1))
    return value if 0 < value < 100_000 else None
