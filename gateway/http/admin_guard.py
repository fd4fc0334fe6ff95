"""Who may use the admin surface: the admin token, as `Authorization: Bearer <token>` only,
compared in constant time, with failed attempts throttled per client address, listener and surface.

A client address that presents a wrong token `max_failures` times within `window_s` is refused
(429, code 971, `Retry-After`) until its oldest failure leaves the window, even when it then
presents the right token: a guesser learns nothing more while throttled.

Failures are kept apart where a tenant could otherwise lock the operator out. Each listener keeps
its own tables (`listener`: "public" or "admin", gateway/http/listeners.py), and within a listener
each surface has its own (`Surface`): the admin API ("admin"), the dashboard's login, which takes
tenants' keys too ("dashboard"), and the admin extras on inference routes, the `x-edgerun-explain`
header ("explain"). Failures on the admin API throttle every surface of that listener (a guesser
refused there cannot go on through the others); failures on the dashboard or in the explain header
throttle only that surface. So wrong explain headers or mistyped dashboard keys from a tenant
behind the operator's address (a proxy, `edgerun dev` on loopback) never refuse the operator's
admin token, with an admin listener or without one. Each table is bounded (`max_clients`, oldest
first out), so a flood of addresses costs a fixed amount of memory. Each replica throttles on its
own; with the admin token at least 32 characters (settings), guessing is hopeless anyway, and the
throttle keeps the logs and the CPU quiet.
"""

from __future__ import annotations

import hmac
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Literal

from gateway.errors import AuthenticationFailed, GatewayError

MIN_ADMIN_TOKEN_CHARS = 32
Surface = Literal["admin", "dashboard", "explain"]  # where a token was presented (module doc)


class AdminThrottled(GatewayError):
    """Too many failed admin attempts from one address; code 971 is the Cloudflare API's
    "Please wait and consider throttling your request speed"."""

    code, status, openai_type = 971, 429, "rate_limit_error"


def presented_bearer(authorization: str | None) -> str | None:
    """The token of `Authorization: Bearer <token>` (the scheme in any case, as RFC 9110 allows);
    any other scheme, or a bare token, is None."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def token_matches(expected: str | None, presented: str | None) -> bool:
    """Constant-time equality; no configured token matches nothing."""
    if not expected or not presented:
        return False
    return hmac.compare_digest(expected.encode(), presented.encode())


@dataclass(eq=False, slots=True)
class AdminGuard:
    """The admin token check plus the throttle of failures per address, one table per listener and
    surface (one per process)."""

    token: str | None = field(repr=False)
    _: KW_ONLY
    max_failures: int = 10
    window_s: float = 60.0
    max_clients: int = 10_000
    clock: Callable[[], float] = time.monotonic
    # (listener, surface) -> address -> failure times
    _failures: dict[tuple[str, Surface], OrderedDict[str, deque[float]]] = field(
        default_factory=dict, init=False, repr=False
    )

    def check(self, authorization: str | None, client: str | None, listener: str, surface: Surface = "admin") -> None:
        """Pass, or raise AdminThrottled (429) / AuthenticationFailed (401, counted as a failure)."""
        self._refuse_if_throttled(client or "", listener, surface)
        if not token_matches(self.token, presented_bearer(authorization)):
            self.record_failure(client or "", listener, surface)
            raise AuthenticationFailed("Authentication error: the admin API needs 'Authorization: Bearer <admin token>'")

    def matches(self, presented: str | None, client: str | None, listener: str) -> bool:
        """For optional admin extras on public routes (x-edgerun-explain): True only for the right
        token from an address that is not throttled; a wrong one counts as a failure (of "explain")."""
        if not presented:
            return False
        if self.retry_after_s(client or "", listener, "explain") is not None:
            return False
        if token_matches(self.token, presented):
            return True
        self.record_failure(client or "", listener, "explain")
        return False

    def retry_after_s(self, client: str, listener: str, surface: Surface = "admin") -> float | None:
        """Seconds until `client` may try `surface` of `listener` again, or None when it is not
        throttled there (the admin API's failures throttle every surface: module doc)."""
        waits = [self._wait(client, (listener, surface))]
        if surface != "admin":
            waits.append(self._wait(client, (listener, "admin")))
        found = [wait for wait in waits if wait is not None]
        return max(found) if found else None

    def _wait(self, client: str, where: tuple[str, Surface]) -> float | None:
        table = self._failures.get(where)
        failures = table.get(client) if table is not None else None
        if table is None or failures is None:
            return None
        self._expire(failures, self.clock())
        if not failures:
            del table[client]
            return None
        if len(failures) < self.max_failures:
            return None
        return max(failures[0] + self.window_s - self.clock(), 0.001)

    def _refuse_if_throttled(self, client: str, listener: str, surface: Surface) -> None:
        wait = self.retry_after_s(client, listener, surface)
        if wait is not None:
            raise AdminThrottled(
                f"Please wait and consider throttling your request speed: too many failed admin attempts "
                f"from this address; retry in {math.ceil(wait)}s",
                retry_after_s=wait,
            )

    def record_failure(self, client: str, listener: str, surface: Surface = "admin") -> None:
        """Count one failed admin attempt from `client` on `surface` of `listener` (also for callers
        that check tokens themselves)."""
        now = self.clock()
        table = self._failures.setdefault((listener, surface), OrderedDict())
        failures = table.pop(client, None) or deque()
        self._expire(failures, now)
        failures.append(now)
        while len(failures) > self.max_failures:
            failures.popleft()
        table[client] = failures  # most recent last
        while len(table) > self.max_clients:
            table.popitem(last=False)

    def _expire(self, failures: deque[float], now: float) -> None:
        while failures and failures[0] <= now - self.window_s:
            failures.popleft()
