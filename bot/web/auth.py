"""Request authentication for the webhook (bearer or basic, as Alertmanager's http_config sends)
and for the command API (a separate admin bearer token). Constant-time comparisons only.

Credentials are ASCII (RFC 9110 token68): a header with any other byte — which aiohttp hands
over as a lone surrogate when it is not UTF-8 — is malformed, answered 401, never compared.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from dataclasses import dataclass

from aiohttp import web


@dataclass(frozen=True, slots=True)
class Credentials:
    bearer: str | None = None
    basic_user: str | None = None
    basic_password: str | None = None

    @property
    def required(self) -> bool:
        return self.bearer is not None or self.basic_user is not None


def check(request: web.Request, expected: Credentials) -> web.Response | None:
    """``None`` when the request may proceed, else the 401/403 answer to send."""
    if not expected.required:
        return None
    header = request.headers.get("Authorization", "")
    if not header.isascii():
        return _unauthorised(expected, "malformed credentials: the Authorization header is not ASCII")
    scheme, _, value = header.partition(" ")
    scheme, value = scheme.lower(), value.strip(" \t")
    if expected.bearer is not None and scheme == "bearer" and value:
        return None if _same(value, expected.bearer) else _forbidden()
    if expected.basic_user is not None and scheme == "basic" and value:
        try:
            user, _, password = base64.b64decode(value, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return _unauthorised(expected, "malformed basic credentials")
        ok = _same(user, expected.basic_user) & _same(password, expected.basic_password or "")
        return None if ok else _forbidden()
    return _unauthorised(expected, "credentials required")


def _same(given: str, wanted: str) -> bool:
    return hmac.compare_digest(given.encode(), wanted.encode())


def _unauthorised(expected: Credentials, reason: str) -> web.Response:
    challenge = 'Bearer realm="pitcrew"' if expected.bearer is not None else 'Basic realm="pitcrew"'
    return web.json_response({"error": reason}, status=401, headers={"WWW-Authenticate": challenge})


def _forbidden() -> web.Response:
    return web.json_response({"error": "invalid credentials"}, status=403)
