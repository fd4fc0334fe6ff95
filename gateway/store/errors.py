"""Errors the store raises. Everything else (sqlite3, redis) is converted at the store's edge.

    StoreError
    ├── InvalidArgument (a ValueError)     bad id, negative count, unknown status ... -> HTTP 400
    │   └── TokensOverLimit                the request alone needs more than the key's tpm -> 413
    ├── Conflict                           tenant id or account id already taken -> 409
    ├── NotFound                           the tenant or key named does not exist -> 404
    └── StoreUnavailable                   Redis unreachable or timing out, the SQLite file unwritable -> 503
        └── StoreFull                      Redis refuses writes: maxmemory reached (OOM) -> 503
"""

from __future__ import annotations


class StoreError(Exception):
    """Base of every error the store raises."""


class InvalidArgument(StoreError, ValueError):
    """An argument the store cannot accept; the message says which and why."""


class TokensOverLimit(InvalidArgument):
    """The request's token estimate exceeds the key's whole per-minute allowance, so waiting never helps."""

    def __init__(self, tokens: int, tpm: int) -> None:
        super().__init__(
            f"the request needs about {tokens} tokens but the key allows {tpm} tokens per minute; "
            "lower max_tokens or shorten the prompt, or raise the key's tpm"
        )
        self.tokens = tokens
        self.tpm = tpm


class Conflict(StoreError):
    """The thing to create already exists (tenant id) or is owned by someone else (account id)."""


class NotFound(StoreError):
    """The tenant or key the call names does not exist."""


class StoreUnavailable(StoreError):
    """The shared store (Redis, or the SQLite file) cannot be reached; the request may be retried later."""


class StoreFull(StoreUnavailable):
    """Redis is at `maxmemory` and refuses writes (OOM); reads still work. Retry later; operators
    must free memory (ledger retention, SECURITY.md) or raise maxmemory."""
