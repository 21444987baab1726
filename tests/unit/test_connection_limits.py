"""The pure parts of the connection limits: the cap the open-files limit allows, the log filter.

Cases: the configured cap stands while the open-files limit leaves room for it (1,024 files:
512 stands, 1,000 is lowered to 768), a small limit keeps half in reserve, an unlimited one
changes nothing; a flood of one error record lets one through per interval, and the next one
through says how many were dropped; different messages are limited apart.
"""

from __future__ import annotations

import logging
import resource
from typing import Any, cast

from bot.web.limits import RateLimitFilter, effective_cap


def test_the_cap_leaves_room_for_everything_else() -> None:
    assert effective_cap(512, 1024) == 512
    assert effective_cap(1000, 1024) == 768
    assert effective_cap(512, 256) == 128
    assert effective_cap(512, 10) == 8
    assert effective_cap(4096, resource.RLIM_INFINITY) == 4096


def _record(msg: str) -> logging.LogRecord:
    return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, msg, None, None)


def test_a_flood_of_one_record_is_one_line_per_interval() -> None:
    now = [0.0]
    limit = RateLimitFilter(interval=10.0, clock=lambda: now[0])
    passed = []
    for step in range(11_700):  # 11,700 accept errors in 8 s, as measured without the cap
        now[0] = step * 8 / 11_700
        record = _record("socket.accept() out of system resource")
        if limit.filter(record):
            passed.append(record)
    assert len(passed) == 1
    now[0] = 10.5
    later = _record("socket.accept() out of system resource")
    assert limit.filter(later) and cast(Any, later).suppressed == 11_699
    other = _record("Error handling request")
    assert limit.filter(other) and not hasattr(other, "suppressed")
