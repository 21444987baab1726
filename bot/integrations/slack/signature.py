"""Slack's v0 request signature, checked on the raw bytes, and a memory of the requests already seen.

Slack signs each HTTP request: ``X-Slack-Signature: v0=hex(HMAC-SHA256(signing secret,
"v0:{X-Slack-Request-Timestamp}:{raw body}"))``, and a receiver refuses a timestamp more than
5 minutes away (python-slack-sdk ``signature/__init__.py``; docs.slack.dev/authentication/
verifying-requests-from-slack). slack_sdk's own verifier raises on a timestamp that is not an
integer, on a non-ASCII signature and on a body that is not UTF-8, so this one checks every value's
shape first: nothing a sender controls can raise.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections import OrderedDict
from collections.abc import Callable

#: Slack's freshness window for a signed request (slack_sdk ``SignatureVerifier``: 5 minutes).
WINDOW = 300
_MAX_REMEMBERED = 100_000


class SlackSignature:
    """Slack's v0 request signature, checked on the raw bytes, plus a memory of the requests seen.

    ``refusal`` says why a request is not from Slack (``None``: it is, and it is new). Every
    header value and the body are checked for shape first, so nothing a sender controls can raise
    (slack_sdk's verifier raises on a timestamp like ``abc`` or ``1.7e9``, on a non-ASCII
    signature, and on a body that is not UTF-8). A signature is remembered for the window in which
    Slack would accept it: the same signed bytes sent again — a captured ``/pitcrew resume`` or
    Approve click replayed — are refused. The memory is this process's (a restart forgets it;
    the 5-minute window bounds what it must hold)."""

    def __init__(self, secret: str, clock: Callable[[], float] = time.time) -> None:
        self._secret = secret.encode()
        self._clock = clock
        self._seen: OrderedDict[str, float] = OrderedDict()  # signature → when it stops being fresh

    def refusal(self, body: bytes, timestamp: str, signature: str) -> str | None:
        if not (timestamp.isascii() and timestamp.isdigit() and len(timestamp) <= 12):
            return "the timestamp is not a whole number of seconds"
        now = self._clock()
        if abs(now - int(timestamp)) > WINDOW:
            return "the timestamp is more than 5 minutes away"
        if not (signature.isascii() and signature.startswith("v0=")):
            return "no v0 signature"
        try:
            body.decode()
        except UnicodeDecodeError:
            return "the body is not UTF-8"
        base = b"v0:" + timestamp.encode() + b":" + body
        expected = "v0=" + hmac.new(self._secret, base, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected.encode(), signature.encode()):
            return "the signature does not match"
        self._forget(now)
        if signature in self._seen:
            return "a replay of a request already received"
        self._seen[signature] = int(timestamp) + WINDOW
        if len(self._seen) > _MAX_REMEMBERED:
            self._seen.popitem(last=False)
        return None

    def _forget(self, now: float) -> None:
        while self._seen:
            signature, fresh_until = next(iter(self._seen.items()))
            if fresh_until >= now:
                return
            del self._seen[signature]
