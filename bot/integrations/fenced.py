"""The fence's last check, made where an HTTP adapter's request leaves: after its connection.

A leader's adapter asks its ``Fence`` before a call that changes a far side. Between that check
and the bytes leaving there is still the connection to make (a new TCP and TLS handshake, a
free slot in the pool): a leader stopped there (SIGSTOP, a frozen VM, a long GC) wakes past its
lease with the request already on its way. The fencing e2e saw it once: the old leader's
``chat.update`` reached Slack after the new leader had ended the incident.

``last_check`` is an aiohttp trace whose ``on_request_headers_sent`` hook asks the fence
again; aiohttp fires it inside ``ClientRequest.send``, once the connection is held and before
the headers are written (it buffers them and writes them with the body). ``Deposed`` raised
there ends the request: aiohttp closes the connection and nothing reaches the far side. What is
left is the instant between this hook and the write, which only a far side that checks the
epoch itself could close. Requests that only read (``GET``, ``HEAD``) pass: a process standing
by may still read; but a request its sender marks as a change (``CHANGES``, its
``trace_request_ctx``) is fenced whatever its method: slurmrestd requeues a job on a ``GET``.
"""

from __future__ import annotations

from types import SimpleNamespace

import aiohttp

from bot.store.lease import Fence

#: Methods that change nothing on the far side: not fenced, unless the request says it changes.
READS = frozenset({"GET", "HEAD"})
#: ``trace_request_ctx`` of a request that changes the far side whatever its method.
CHANGES = SimpleNamespace(changes=True)


def last_check(fence: Fence) -> aiohttp.TraceConfig:
    """A trace config that asks ``fence`` (``token``: ``Deposed`` once the lease may have
    lapsed) just before a changing request's headers are written."""

    async def check(
        _session: aiohttp.ClientSession, ctx: SimpleNamespace, params: aiohttp.TraceRequestHeadersSentParams
    ) -> None:
        marked = getattr(ctx.trace_request_ctx, "changes", False)
        if params.method.upper() not in READS or marked:
            fence.token()

    trace = aiohttp.TraceConfig()
    trace.on_request_headers_sent.append(check)
    return trace


def traces(fence: Fence | None) -> list[aiohttp.TraceConfig]:
    """The trace configs of a client that changes a far side: ``last_check`` of ``fence``, or
    none without one (``check-config --live``, tests)."""
    return [last_check(fence)] if fence is not None else []
