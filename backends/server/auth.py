"""Who may talk to a backend: the gateway, proving it holds the shared secret.

Every request but `GET /health` (what load balancers and orchestrators probe) must carry
`Authorization: Bearer <api_key>`, the header vLLM's and SGLang's `--api-key` check, so one
gateway configuration reaches ours and theirs alike. The comparison is constant-time. A request
without it, or with another secret, gets 401 in OpenAI's error shape and never reaches a route:
prompts, KV events, the tokenizer, metrics and generation are all behind it.

`check_exposure` is the start-up rule: a backend that listens beyond loopback must have a secret,
unless the operator opts out explicitly (`allow_unauthenticated`, for a network that does its
own authentication, e.g. a mesh with mTLS).
"""

from __future__ import annotations

import hmac
import ipaddress
import json

from starlette.types import ASGIApp, Receive, Scope, Send

from contracts.openai_error import error_body

OPEN_PATHS = frozenset({("GET", "/health"), ("HEAD", "/health")})
_CHALLENGE = [(b"www-authenticate", b'Bearer realm="edgerun-backend"')]


class InsecureBinding(ValueError):
    """A backend would listen beyond loopback with no secret."""


class BearerAuth:
    """Pure ASGI middleware: 401 unless `Authorization: Bearer <api_key>`; None lets everyone in."""

    def __init__(self, app: ASGIApp, api_key: str | None) -> None:
        self.app = app
        self._expected = f"Bearer {api_key}".encode() if api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._expected is None or scope["type"] != "http" or (scope["method"], scope["path"]) in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        presented = next((value for name, value in scope["headers"] if name == b"authorization"), b"")
        if hmac.compare_digest(presented, self._expected):
            await self.app(scope, receive, send)
            return
        message = (
            "missing or wrong backend API key: send 'Authorization: Bearer <key>' with the key the backend "
            "was started with (the gateway's backend_api_key)"
        )
        body = json.dumps(error_body(message, "authentication_error", 401)).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *_CHALLENGE]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a hostname or "0.0.0.0"-like wildcard we cannot prove to be local


def check_exposure(host: str, api_key: str | None, allow_unauthenticated: bool) -> None:
    """Raise InsecureBinding when `host` is not loopback, no key is set and no opt-out was given."""
    if api_key or allow_unauthenticated or is_loopback(host):
        return
    raise InsecureBinding(
        f"refusing to listen on {host} without a backend API key: anyone who reaches this port could read "
        "every tenant's prompts and generate unbilled. Set EDGERUN_API_KEY (the same secret as the gateway's "
        "EDGERUN_BACKEND_API_KEY), bind to 127.0.0.1, or pass --allow-unauthenticated if the network "
        "authenticates callers itself (e.g. mTLS in a service mesh)"
    )
