"""The server's key: who may use the model (`flywheel serve --api-key KEY`, or `FLYWHEEL_API_KEY`).

A server started with a key answers a request only when it carries `Authorization: Bearer KEY`, as the
OpenAI API and every OpenAI client expect (the SDK's `api_key` is sent that way). Anything else gets 401
with an OpenAI error body (`unauthorized`, code `invalid_api_key`) and nothing more: not the model's name,
not a weights version, not whether the path exists. The one exception is `GET /health`, which keeps
answering, with only `status` and `policy_version` (`public_health`), so a load balancer or a supervisor
can still watch the server; a request with the key gets the whole answer (the last update's pause too).

Keys are compared in constant time (`hmac.compare_digest`). A key must be printable ASCII without spaces
(`check_key`): an HTTP header carries nothing else intact.

What is covered: who may generate, list the model or read the full health answer. What is not: the
traffic itself (the key and the prompts travel in clear over plain HTTP: put a TLS proxy in front of a
server that listens beyond a trusted network), rate limits, and several keys or per-key permissions.
Without a key nothing changes, except that serving on a host other than loopback is warned about in one
line (`exposure_warning`).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from typing import Any

from flywheel.errors import FlywheelError
from flywheel.serve.wire import ApiError
from flywheel.settings import API_KEY_ENV

PUBLIC_HEALTH = ("status", "policy_version")  # what `GET /health` answers a request without the key
LOOPBACK_NAMES = ("localhost",)


def check_key(key: str | None) -> None:
    """Refuse a key that is empty or that an HTTP header cannot carry, in one line (None: no key)."""
    if key is None:
        return
    if not key:
        raise FlywheelError(f"api key (--api-key or {API_KEY_ENV}): must not be empty")
    if not all("!" <= ch <= "~" for ch in key):
        raise FlywheelError(f"api key (--api-key or {API_KEY_ENV}): must be printable ASCII without spaces")


def authorized(header: str | None, key: str) -> bool:
    """Whether an `Authorization` header value is `Bearer KEY` (the scheme in any case). The comparison
    takes the same time whatever the token, its length included: it compares digests of equal length."""
    scheme, _, token = (header or "").strip().partition(" ")
    given = hashlib.sha256(token.strip().encode("latin-1", "replace")).digest()
    same = hmac.compare_digest(given, hashlib.sha256(key.encode()).digest())
    return same and scheme.lower() == "bearer"


def unauthorized() -> ApiError:
    """The 401 a request without the key, or with a wrong one, gets."""
    return ApiError(
        401,
        "a valid API key is required: send it as 'Authorization: Bearer KEY'",
        param=None,
        code="invalid_api_key",
    )


def public_health(answer: dict[str, Any]) -> dict[str, Any]:
    """The part of a health answer a request without the key may see."""
    return {k: answer[k] for k in PUBLIC_HEALTH if k in answer}


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or a name) is reachable from this machine only."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name other than localhost: it may resolve to any interface


def exposure_warning(host: str, key: str | None) -> str | None:
    """The one line a server open beyond loopback without a key warns with (None: nothing to warn of)."""
    if key or is_loopback(host):
        return None
    where = host or "every interface"
    return (
        f"warning: serving on {where} without an API key: anyone who reaches this port may use the model "
        f"(set --api-key or {API_KEY_ENV})"
    )
