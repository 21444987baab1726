"""Human durations in configuration: ``30s``, ``5m``, ``24h``, ``7d``, ``1h30m`` or plain seconds."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: Any) -> timedelta:
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise ValueError("a duration, e.g. 30s, 5m, 24h")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError("durations cannot be negative")
        return timedelta(seconds=value)
    if isinstance(value, str):
        text = value.strip().replace(" ", "")
        if text and _PART.sub("", text) == "":
            return timedelta(seconds=sum(float(n) * _UNIT[u] for n, u in _PART.findall(text)))
        try:
            return parse_duration(float(text))
        except ValueError:
            pass
    raise ValueError(f"{value!r} is not a duration (examples: 30s, 5m, 24h, 1h30m)")


def format_duration(value: timedelta) -> str:
    """``timedelta(hours=2, minutes=3)`` → ``2h3m``; sub-second values keep their decimals."""
    seconds = value.total_seconds()
    if seconds < 60:
        return f"{seconds:.3g}s" if seconds < 10 and not seconds.is_integer() else f"{round(seconds)}s"
    whole = round(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, whole = divmod(whole, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


Duration = Annotated[
    timedelta,
    BeforeValidator(parse_duration),
    PlainSerializer(format_duration, return_type=str),
]


_GO_PART = re.compile(r"(\d*\.?\d*)(ns|us|µs|μs|ms|s|m|h)")
_GO_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_go_duration(text: str) -> timedelta:
    """A duration as Go's ``time.ParseDuration`` reads it, as Kubernetes controllers written in Go
    take it from an annotation: an optional sign, then numbers each with a unit (``ns``, ``us``,
    ``ms``, ``s``, ``m``, ``h``: ``5m``, ``1h30m``, ``1.5h``), or ``0``. No days, no bare number."""
    sign, body = (-1.0, text[1:]) if text.startswith("-") else (1.0, text.removeprefix("+"))
    if body == "0":
        return timedelta(0)
    parts = _GO_PART.findall(body)
    if not body or "".join(n + u for n, u in parts) != body or any(n in ("", ".") for n, _ in parts):
        raise ValueError(f"{text!r} is not a Go duration (examples: 5m, 1h30m)")
    return timedelta(seconds=sign * sum(float(n) * _GO_UNIT[u] for n, u in parts))
