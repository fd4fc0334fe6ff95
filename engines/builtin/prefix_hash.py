"""Chained, tenant-salted hashes of full KV blocks, stable across processes.

The encoding is the gateway's (`policies/prefix.py`), so the hashes in our KV cache events are
the ones its prefix index computes from the same token ids:

    root          = BLAKE2b-64(salt.utf8, person=b"edgerun-tenant")     ("" and None: the unsalted namespace)
    hash(block i) = BLAKE2b-64(parent as 8 bytes little-endian signed
                               + tokens as little-endian int32, person=b"edgerun-block")
    parent        = root for block 0, hash(block i-1) after that

Digests are read as little-endian signed 64-bit integers. Only full blocks are hashed; two
tenants never share a chain because their roots differ, and one tenant's identical prefix
always hashes the same.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

_BLOCK_PERSON = b"edgerun-block"
_SALT_PERSON = b"edgerun-tenant"


def salt_root(cache_salt: str | None) -> int:
    """The parent hash of a chain's first block: the tenant's namespace."""
    digest = hashlib.blake2b((cache_salt or "").encode(), digest_size=8, person=_SALT_PERSON).digest()
    return int.from_bytes(digest, "little", signed=True)


def block_hash(parent_hash: int, token_ids: Sequence[int]) -> int:
    h = hashlib.blake2b(parent_hash.to_bytes(8, "little", signed=True), digest_size=8, person=_BLOCK_PERSON)
    h.update(struct.pack(f"<{len(token_ids)}i", *token_ids))
    return int.from_bytes(h.digest(), "little", signed=True)


def chain_hashes(token_ids: Sequence[int], block_size: int, cache_salt: str | None) -> list[int]:
    """Hashes of every full block of `token_ids`, in order."""
    hashes: list[int] = []
    parent = salt_root(cache_salt)
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = block_hash(parent, token_ids[start : start + block_size])
        hashes.append(parent)
    return hashes
