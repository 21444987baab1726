"""The three PATCH content types of the apiserver, applied to plain JSON objects.

Owns what each content type does to maps and lists; knows nothing about HTTP or storage.
Strategic merge only merges the lists the Kubernetes types declare with a patch strategy
(``MERGE_KEYS``); every other list, ``spec.taints`` included (``+listType=atomic``), is replaced whole.
"""

from __future__ import annotations

import copy
from typing import Any

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"

#: Lists merged by key under strategic merge (path of keys → merge key), from core/v1 and meta/v1 tags.
MERGE_KEYS: dict[tuple[str, ...], str] = {
    ("status", "conditions"): "type",
    ("status", "addresses"): "type",
    ("metadata", "ownerReferences"): "uid",
    ("spec", "containers"): "name",
    ("spec", "initContainers"): "name",
    ("spec", "volumes"): "name",
}
#: Lists of scalars merged as sets under strategic merge.
SET_LISTS: set[tuple[str, ...]] = {("metadata", "finalizers")}


class PatchError(ValueError):
    """The patch body is malformed for its content type (the apiserver answers 400)."""


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: maps merge, ``null`` deletes a key, anything else (lists included) replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any, path: tuple[str, ...] = ()) -> Any:
    """Kubernetes strategic merge for the declared lists; merge-patch semantics everywhere else."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        sub = (*path, key)
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and MERGE_KEYS.get(sub) and isinstance(result.get(key), list):
            result[key] = _merge_list_by_key(result[key], value, MERGE_KEYS[sub], sub)
        elif isinstance(value, list) and sub in SET_LISTS and isinstance(result.get(key), list):
            result[key] = result[key] + [v for v in value if v not in result[key]]
        else:
            result[key] = strategic_merge_patch(result.get(key), value, sub)
    return result


def _merge_list_by_key(current: list[Any], patch: list[Any], key: str, path: tuple[str, ...]) -> list[Any]:
    merged = [copy.deepcopy(item) for item in current]
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            raise PatchError(f"map in list {'.'.join(path)} has no merge key {key!r}")
        index = next((i for i, old in enumerate(merged) if old.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if index is not None:
                del merged[index]
        elif index is None:
            merged.append(copy.deepcopy(item))
        else:
            merged[index] = strategic_merge_patch(merged[index], item, path)
    return merged


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902 ``add``/``remove``/``replace``/``test``; a body that is not an array is a 400."""
    if not isinstance(operations, list):
        raise PatchError("the body of a JSON Patch must be a JSON array")
    doc = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(f"malformed JSON Patch operation: {op!r}")
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent = doc
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        last = parts[-1]
        try:
            if op["op"] == "test":
                current = parent[int(last)] if isinstance(parent, list) else parent[last]
                if current != op.get("value"):
                    raise PatchError(f"test failed at {op['path']}")
            elif op["op"] == "remove":
                del parent[int(last) if isinstance(parent, list) else last]
            elif op["op"] == "replace":
                index = int(last) if isinstance(parent, list) else last
                parent[index]  # a replace needs an existing member (RFC 6902 4.3)
                parent[index] = copy.deepcopy(op["value"])
            elif op["op"] == "add" and isinstance(parent, list):
                parent.insert(len(parent) if last == "-" else int(last), copy.deepcopy(op["value"]))
            elif op["op"] == "add":
                parent[last] = copy.deepcopy(op["value"])
            else:
                raise PatchError(f"unsupported JSON Patch op {op['op']!r}")
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            if isinstance(exc, PatchError):
                raise
            raise PatchError(f"cannot apply {op['op']} at {op['path']}") from exc
    return doc
