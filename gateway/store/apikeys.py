"""API key secrets: made with `secrets`, shown once, stored only as a SHA-256 hash.

A secret is "edg_" + 48 hex characters (192 random bits). So much entropy makes a fast hash
safe (no salt or slow KDF needed: nobody can enumerate 2^192 candidates), and lets a lookup find
the key by its hash in one step. The hash found is still compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

SECRET_PREFIX = "edg_"
SHOWN_CHARS = len(SECRET_PREFIX) + 6  # "edg_ab12cd": enough to tell keys apart in a listing
_MAX_SECRET_CHARS = 256


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_hex(24)


def new_id(kind: str) -> str:
    """A random id such as "key_5f2c9a0b1d3e4f60"."""
    return f"{kind}_{secrets.token_hex(8)}"


def shown_prefix(secret: str) -> str:
    return secret[:SHOWN_CHARS]


def hash_secret(secret: str) -> str | None:
    """Hex SHA-256 of a presented secret; None when it cannot be one of ours (saves a lookup)."""
    if not isinstance(secret, str) or not secret.startswith(SECRET_PREFIX) or len(secret) > _MAX_SECRET_CHARS:
        return None
    return hashlib.sha256(secret.encode()).hexdigest()


def same_hash(stored: str, presented: str) -> bool:
    return hmac.compare_digest(stored.encode(), presented.encode())
