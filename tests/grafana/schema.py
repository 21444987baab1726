"""A dashboard JSON file checked against Grafana's schema, as grafana-foundation-sdk's types encode it.

The SDK's models are generated from Grafana's own schemas: the ``dashboard`` kind, each panel
plugin's options and field config, each datasource's query. :func:`violations` reads a file the
way the SDK decodes one (with the default plugins registered, so a stat panel's options become
the stat plugin's ``Options`` and a Prometheus query a Prometheus ``Dataquery``) and reports:

* a key the schema does not have (the decoder drops it, so it is missing when re-encoded), and
  a value the schema's types would write differently (a key left out is not one: Grafana fills
  in the schema's default);
* a value of the wrong type, an enum or literal value the schema does not list, a wrong-typed
  list item or map value, checked field by field against the models' annotations, including the
  parts the decoder keeps as plain JSON (dashboard links, transformations);
* a panel type or query datasource type the SDK has no schema for (nothing would be checked).

Override values, transformation options and data links inside overrides are ``any`` in Grafana's
schema; they are not checked here beyond being JSON.
"""

from __future__ import annotations

import enum
import json
import types
import typing
from collections.abc import Iterator
from typing import Any, cast

from grafana_foundation_sdk.cog import runtime
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models.dashboard import Dashboard, Panel


def violations(document: dict[str, Any]) -> list[str]:
    """Every way ``document`` departs from Grafana's dashboard schema; empty when it conforms."""
    register_default_plugins()
    model = Dashboard.from_json(document)
    found = list(_differences(document, _encoded(model), "dashboard"))
    found += _check(model, Dashboard, "dashboard")
    for number, panel in enumerate(model.panels or []):
        if isinstance(panel, Panel) and runtime.panelcfg_config(panel.type_val) is None:
            found.append(f"dashboard.panels[{number}]: no schema for panel type {panel.type_val!r}")
        for ref, target in enumerate((panel.targets or []) if isinstance(panel, Panel) else []):
            if isinstance(target, runtime.UnknownDataquery):
                found.append(f"dashboard.panels[{number}].targets[{ref}]: no schema for its datasource type")
    return found


def _encoded(model: object) -> Any:
    return json.loads(json.dumps(model, cls=JSONEncoder))


def _differences(given: Any, schema: Any, path: str) -> Iterator[str]:
    if isinstance(given, dict) and isinstance(schema, dict):
        for key in given.keys() - schema.keys():
            yield f"{path}.{key}: not in Grafana's schema"
        for key in given.keys() & schema.keys():
            yield from _differences(given[key], schema[key], f"{path}.{key}")
    elif isinstance(given, list) and isinstance(schema, list) and len(given) == len(schema):
        for number, (one, other) in enumerate(zip(given, schema, strict=True)):
            yield from _differences(one, other, f"{path}[{number}]")
    elif given != schema:
        yield f"{path}: {json.dumps(given)[:80]} reads back as {json.dumps(schema)[:80]}"


def _is_model(value: object) -> bool:
    return callable(getattr(value, "to_json", None)) and not isinstance(value, type)


def _check(value: Any, hint: Any, path: str) -> list[str]:
    if _is_model(value):  # a schema type, also where the field is typed ``object`` (a plugin's options)
        if isinstance(hint, type) and _is_model_class(hint) and not isinstance(value, hint):
            return [f"{path}: a {type(value).__name__}, not a {hint.__name__}"]
        return _fields(value, path)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint in (object, Any):
        return []
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return []
        attempts = [_check(value, arg, path) for arg in args if arg is not type(None)]
        return [] if any(not errors for errors in attempts) else min(attempts, key=len)
    if origin is typing.Literal:
        return [] if value in args else [f"{path}: {value!r} is not one of {list(args)}"]
    if origin is list:
        if not isinstance(value, list):
            return [f"{path}: {type(value).__name__}, not a list"]
        return [error for n, item in enumerate(value) for error in _check(item, args[0], f"{path}[{n}]")]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{path}: {type(value).__name__}, not an object"]
        return [error for key, item in value.items() for error in _check(item, args[1], f"{path}.{key}")]
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        allowed = [member.value for member in hint]
        return [] if value in allowed else [f"{path}: {value!r} is not one of {allowed}"]
    if isinstance(hint, type) and _is_model_class(hint):
        if not isinstance(value, dict):
            return [f"{path}: {type(value).__name__}, not a {hint.__name__}"]
        # kept as plain JSON by the decoder (links, transformations); ``_is_model_class`` checked from_json
        decoded = cast(Any, hint).from_json(value)
        return [*_differences(value, _encoded(decoded), path), *_fields(decoded, path)]
    return _scalar(value, hint, path)


def _is_model_class(hint: type) -> bool:
    return callable(getattr(hint, "from_json", None)) and callable(getattr(hint, "to_json", None))


def _scalar(value: Any, hint: Any, path: str) -> list[str]:
    kinds: dict[Any, tuple[type, ...]] = {bool: (bool,), int: (int,), float: (int, float), str: (str,)}
    wanted = kinds.get(hint)
    if wanted is None:
        return [f"{path}: cannot check against {hint!r}"]
    if isinstance(value, bool) and hint is not bool:
        return [f"{path}: {value!r} is a boolean, not a {hint.__name__}"]
    return [] if isinstance(value, wanted) else [f"{path}: {value!r} is not a {hint.__name__}"]


def _fields(model: object, path: str) -> list[str]:
    hints = typing.get_type_hints(type(model))
    return [
        error
        for name, hint in hints.items()
        for error in _check(getattr(model, name), hint, f"{path}.{name}")
    ]
