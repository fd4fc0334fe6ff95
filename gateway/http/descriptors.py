"""File descriptors: the process's open-file limit, and connection caps that fit under it.

Every connection a listener accepts takes a descriptor, as do the gateway's own connections to
backends and to Redis, its SQLite files and its logs, all out of one per-process limit (the soft
RLIMIT_NOFILE; systemd's default is 1024, with a hard limit of 524288). Past it `accept()` fails
with EMFILE, and uvloop (libuv) then accepts and closes the waiting connections at once, on every
listener of the process, the admin one too, and logs nothing: 1,100 idle connections reset both
listeners. So:

- at start the soft limit is raised to the hard one (`raise_open_file_limit`; no privilege needed);
- the listeners' `max_connections` are fitted under it (`connection_caps`): from the limit go first
  a reserve for what the gateway opens itself (`reserved_descriptors`: every backend connection
  `backend_max_connections` allows, the polls of each backend, the Redis pool, files), then a
  share for the admin listener, and the public listener gets the rest. A full public listener
  answers the next connection 503 while the admin listener, the backends and the store still have
  descriptors; a cap lowered below its setting is logged at start with the limit to raise;
- a listener that refuses connections at its cap says so in the log, at most once per
  `REFUSAL_LOG_INTERVAL_S` with the number refused since (`RefusalLog`).
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

if TYPE_CHECKING:
    from gateway.settings import GatewaySettings

log = structlog.get_logger("edgerun.gateway.descriptors")

BASE_RESERVE = 64  # std streams, listening sockets, the event loop's own, SQLite and its journal, logs, threads
POLL_CONNECTIONS_PER_BACKEND = 4  # health, load, KV events and the tokenizer fetch may overlap
ADMIN_SHARE = 16  # the admin listener gets 1/16 of what is left, at least MIN_ADMIN_CONNECTIONS
MIN_ADMIN_CONNECTIONS = 16
MIN_PUBLIC_CONNECTIONS = 64
REFUSAL_LOG_INTERVAL_S = 10.0


def open_file_limit() -> int:
    """The soft limit on open descriptors now (a large number where there is none)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def raise_open_file_limit() -> int:
    """Raise the soft open-file limit to the hard one (any process may) and return the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or (soft != resource.RLIM_INFINITY and soft < hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:  # e.g. an unlimited hard limit above the kernel's nr_open
            log.warning("could not raise the open-file limit", soft=soft, hard=hard, error=str(exc))
        else:
            log.info("open-file limit raised", soft_before=soft, soft=open_file_limit())
    return open_file_limit()


def reserved_descriptors(settings: GatewaySettings) -> int:
    """Descriptors the gateway may open itself, beside what its listeners accept."""
    store = settings.store
    redis = store.redis_max_connections if store.redis_url is not None else 0
    polls = POLL_CONNECTIONS_PER_BACKEND * len(settings.fleet.backends)
    return BASE_RESERVE + settings.fleet.backend_max_connections + polls + redis


@dataclass(frozen=True, slots=True)
class ConnectionCaps:
    public: int  # max_connections of the public listener
    admin: int | None  # of the admin listener; None: there is none
    limit: int  # the open-file limit they were fitted under
    reserve: int

    @property
    def is_starved(self) -> bool:
        """Whether the limit is too low for even the minimum caps beside the reserve."""
        return self.public + (self.admin or 0) + self.reserve > self.limit


def connection_caps(limit: int, reserve: int, max_connections: int, has_admin: bool) -> ConnectionCaps:
    """Caps for the listeners under `limit` descriptors, `reserve` of them kept for the gateway's own
    connections; each cap at most `max_connections` (the setting) and at least a small minimum."""
    available = limit - reserve
    admin = None
    if has_admin:
        admin = min(max_connections, max(MIN_ADMIN_CONNECTIONS, available // ADMIN_SHARE))
    public = min(max_connections, max(MIN_PUBLIC_CONNECTIONS, available - (admin or 0)))
    return ConnectionCaps(public, admin, limit, reserve)


def fitted_caps(settings: GatewaySettings, *, has_admin: bool) -> ConnectionCaps:
    """`connection_caps` for these settings under this process's limit, logged when they lower a setting."""
    max_connections = settings.listener_limits.max_connections
    caps = connection_caps(open_file_limit(), reserved_descriptors(settings), max_connections, has_admin)
    if caps.is_starved:
        log.error(
            "the open-file limit is too low for the gateway: raise it (systemd: LimitNOFILE=65536; a shell: "
            "ulimit -n 65536) or lower backend_max_connections",
            limit=caps.limit, reserved=caps.reserve, public=caps.public, admin=caps.admin,
        )
    elif caps.public < max_connections or (caps.admin is not None and caps.admin < max_connections):
        log.warning(
            "max_connections lowered to fit the open-file limit; raise the limit (systemd: LimitNOFILE=65536) "
            "to accept more connections",
            limit=caps.limit, reserved=caps.reserve, public=caps.public, admin=caps.admin, setting=max_connections,
        )
    return caps


class RefusalLog:
    """One warning per `interval_s` at most about connections a listener refused at its cap."""

    def __init__(self, listener: str, interval_s: float = REFUSAL_LOG_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.listener = listener
        self.interval_s = interval_s
        self._clock = clock
        self._last: float | None = None
        self.num_unlogged = 0  # refusals since the last line
        self.num_refused = 0

    def refused(self, max_connections: int) -> None:
        self.num_refused += 1
        self.num_unlogged += 1
        now = self._clock()
        if self._last is not None and now - self._last < self.interval_s:
            return
        log.warning(
            "connections refused: the listener has max_connections open (its share of the open-file limit, "
            "or the setting); each refused one was answered 503",
            listener=self.listener, max_connections=max_connections, refused=self.num_unlogged,
        )
        self._last, self.num_unlogged = now, 0
