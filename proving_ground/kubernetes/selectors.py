"""Label and field selectors as the apiserver parses them, over plain JSON objects.

Owns the parsing and matching only; which fields a resource supports is the caller's table.
"""

from __future__ import annotations

import re
from typing import Any

#: Field selectors each resource supports (core/v1 conversion funcs); anything else is a 400.
FIELDS: dict[str, set[str]] = {
    "pods": {
        "metadata.name",
        "metadata.namespace",
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    },
    "nodes": {"metadata.name", "spec.unschedulable"},
    # core/v1 event conversion funcs (pkg/apis/core/v1/conversion.go, AddFieldLabelConversionsForEvent)
    "events": {
        "metadata.name",
        "metadata.namespace",
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    },
}
_DEFAULT_FIELDS = {"metadata.name", "metadata.namespace"}


class SelectorError(ValueError):
    """A selector the apiserver would refuse with 400 Bad Request."""


def _field_value(obj: dict[str, Any], field: str) -> str:
    value: Any = obj
    for part in field.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def field_matches(obj: dict[str, Any], selector: str, plural: str) -> bool:
    """``a=b``, ``a==b``, ``a!=b``, comma means AND; unknown fields raise ``SelectorError``."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        match = re.fullmatch(r"([^=!]+)(==|=|!=)(.*)", term)
        if match is None:
            raise SelectorError(f"invalid field selector: {term}")
        field, op, wanted = match.groups()
        if field not in FIELDS.get(plural, _DEFAULT_FIELDS):
            raise SelectorError(f"field label not supported: {field}")
        if (_field_value(obj, field) == wanted) != (op != "!="):
            return False
    return True


def _split_terms(selector: str) -> list[str]:
    terms, depth, start = [], 0, 0
    for i, ch in enumerate(selector):
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            terms.append(selector[start:i])
            start = i + 1
    terms.append(selector[start:])
    return [t.strip() for t in terms if t.strip()]


def labels_match(labels: dict[str, str], selector: str) -> bool:
    """Equality (``=``, ``==``, ``!=``), set (``in``, ``notin``) and existence (``k``, ``!k``) terms."""
    for term in _split_terms(selector):
        if m := re.fullmatch(r"(\S+)\s+(in|notin)\s+\((.*)\)", term):
            key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            if (key in labels and labels[key] in values) != (op == "in"):
                return False
        elif m := re.fullmatch(r"([^=!\s]+)\s*(==|=|!=)\s*(\S*)", term):
            key, op, value = m.groups()
            if (labels.get(key) == value) != (op != "!="):
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif re.fullmatch(r"[^=!\s()]+", term):
            if term not in labels:
                return False
        else:
            raise SelectorError(f"unable to parse requirement: {term}")
    return True


def selector_matches(labels: dict[str, str], selector: dict[str, Any]) -> bool:
    """A ``metav1.LabelSelector`` object (PDB ``spec.selector``); an empty selector matches everything."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], set(expr.get("values") or [])
        present = key in labels
        ok = {
            "In": present and labels[key] in values,
            "NotIn": not present or labels[key] not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }[op]
        if not ok:
            return False
    return True
