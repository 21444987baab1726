"""How a fault is stored (``bot.store.codec``): every field by name, read back as it was."""

from __future__ import annotations

import json
from dataclasses import fields

from bot.domain.faults import Fault
from bot.store.codec import fault_from, fault_json


def test_a_fault_is_stored_field_by_field_and_read_back_whole() -> None:
    """Every field of a fault, its defaults changed too, is in the stored text under its name (the
    text stores kept: sorted, compact) and comes back equal; none is left out or added."""
    fault = Fault(
        "link",
        "gpu-7",
        None,
        None,
        None,
        "degraded",
        "drain-node",
        False,
        "port flapping",
        True,
        detail="12 flaps in 5 min",
        link="mlx5_0 port 1",
    )
    text = fault_json(fault)
    stored = json.loads(text)
    assert set(stored) == {field.name for field in fields(Fault)}
    assert stored["link"] == "mlx5_0 port 1" and stored["gpu"] is None and stored["job_fatal"] is False
    assert text == json.dumps(stored, separators=(",", ":"), sort_keys=True)
    assert fault_from(text) == fault
