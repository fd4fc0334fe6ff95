"""Errors the backend client raises: the only exceptions that cross the client seam.

    BackendError
    ├── BackendUnavailable    connection refused/reset, or a 5xx answer, before the first byte
    ├── BackendTimeout        no connection within connect_timeout_s, or no first byte within
    │                         first_byte_timeout_s (non-streaming: no answer within read_timeout_s)
    ├── BackendOverloaded     429: the backend has no room now; carries retry_after_s
    ├── BackendRejected       any other 4xx: the request itself is wrong; carries status and message
    ├── BackendStreamBroken   the stream failed after the first byte (error event, reset, read
    │                         timeout, or it ended without [DONE]); retrying would repeat output
    └── ClientAtCapacity      this client already has `max_connections` generation requests open;
                              nothing was sent (no endpoint_id), retry after retry_after_s

The transport's exceptions (`backends.client.http`) never leave the client: each is converted
where it happens with `raise BackendX(...) from exc`, so callers see one tree and the cause stays
in the traceback. Before the first byte every error except BackendRejected is a reason to try
another endpoint.

`answered` tells the two ways a backend can fail apart: True when it read the request and
answered badly (a 5xx status, an error event, a malformed body or stream), which the request's own
content may have caused; False when the connection failed (refused, reset, timed out), which is the
backend's (or the network's) own. The gateway's outlier ejection counts them differently
(policies/breaker.py).
"""

from __future__ import annotations


class BackendError(Exception):
    """Base of every client error; `endpoint_id` names the backend that failed (if known);
    `answered`: the backend answered (a status, an error event, a body), as opposed to a failed connection."""

    def __init__(self, message: str, *, endpoint_id: str | None = None, answered: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.endpoint_id = endpoint_id
        self.answered = answered


class BackendUnavailable(BackendError):
    pass


class BackendTimeout(BackendError):
    """`late`: the connect timer fired late every time, so the gateway's own event loop was busy
    (a burst), not necessarily the backend slow (backends/client/http.py)."""

    def __init__(self, message: str, *, endpoint_id: str | None = None, late: bool = False) -> None:
        super().__init__(message, endpoint_id=endpoint_id)
        self.late = late


class BackendOverloaded(BackendError):
    def __init__(self, message: str, *, retry_after_s: float | None = None, endpoint_id: str | None = None) -> None:
        super().__init__(message, endpoint_id=endpoint_id, answered=endpoint_id is not None)
        self.retry_after_s = retry_after_s


class BackendRejected(BackendError):
    def __init__(self, message: str, *, status: int, endpoint_id: str | None = None) -> None:
        super().__init__(message, endpoint_id=endpoint_id, answered=True)
        self.status = status


class BackendStreamBroken(BackendError):
    pass


class ClientAtCapacity(BackendError):
    """Raised before anything is sent: the caller's own cap, not a backend's answer."""

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
