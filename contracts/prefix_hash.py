"""The one tenant-salted chain of KV block hashes, computed alike by gateway, policies and engine.

The prompt is cut into blocks of `block_size` tokens; only full blocks are hashed (a partial
tail can never be reused by a different request anyway). The chain is

    h0 = H(root(salt) || block0),   h_i = H(h_(i-1) || block_i)

so a block's hash names its whole prefix: the same salt with the same leading tokens gets the
same hashes in every process, and another salt never does. Encoding, fixed once:

- root(salt) = BLAKE2b-64 of the salt's UTF-8 bytes, personalised with b"edgerun-tenant"
  (`None` and "" share the unsalted namespace);
- H(parent || block) = BLAKE2b-64 over the parent's 8 bytes (little-endian two's complement)
  followed by the block's token ids as little-endian signed int32, personalised b"edgerun-block";
- each hash is the digest read as a little-endian *signed* 64-bit integer, so it fits a SQLite
  INTEGER, a numpy int64 and JSON without loss;
- a request under a LoRA adapter hashes its chain with `adapter_salt(salt, adapter)` (as vLLM puts its
  lora id in the block hash): a prefix computed under one adapter is never found under another or the
  base model, in the engine's cache or in the gateway's index.

A 4,096-token prompt in 16-token blocks (256 hashes) takes well under a millisecond
(tests/policies/test_prefix.py measures it).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Sequence
from typing import overload

_BLOCK_PERSON = b"edgerun-block"
_SALT_PERSON = b"edgerun-tenant"
_INT32 = (-(2**31), 2**31 - 1)


class BadTokenId(ValueError):
    """A token id that is not a 32-bit integer cannot be hashed."""


def salt_root(salt: str | None) -> int:
    """The parent hash of a chain's first block: the salt's namespace."""
    digest = hashlib.blake2b((salt or "").encode(), digest_size=8, person=_SALT_PERSON).digest()
    return int.from_bytes(digest, "little", signed=True)


@overload
def adapter_salt(salt: str, adapter: str | None) -> str: ...
@overload
def adapter_salt(salt: str | None, adapter: str | None) -> str | None: ...
def adapter_salt(salt: str | None, adapter: str | None) -> str | None:
    """The salt of a request under LoRA adapter `adapter` (None: the base model, the salt as it is)."""
    return salt if adapter is None else f"{salt or ''}\x1flora:{adapter}"


def hash_packed(parent: int, block_bytes: bytes) -> int:
    """H(parent || block), the block given as its token ids packed little-endian int32."""
    h = hashlib.blake2b(parent.to_bytes(8, "little", signed=True), digest_size=8, person=_BLOCK_PERSON)
    h.update(block_bytes)
    return int.from_bytes(h.digest(), "little", signed=True)


def block_hash(parent: int, token_ids: Sequence[int]) -> int:
    """H(parent || block) for one block's token ids."""
    return hash_packed(parent, pack(token_ids))


def chain_hashes(token_ids: Sequence[int], block_size: int, salt: str | None) -> list[int]:
    """The chain for every full block of `block_size` tokens (a partial tail is left out)."""
    if block_size < 1:
        raise ValueError(f"block_size={block_size} must be >= 1")
    num_full = len(token_ids) // block_size
    packed = pack(token_ids[: num_full * block_size])
    step = 4 * block_size
    parent = salt_root(salt)
    hashes = []
    for start in range(0, len(packed), step):
        parent = hash_packed(parent, packed[start : start + step])
        hashes.append(parent)
    return hashes


def chain_of_blocks(blocks: Iterable[Sequence[int]], salt: str | None) -> list[int]:
    """The chain for blocks already cut (of any one fixed size)."""
    parent = salt_root(salt)
    hashes = []
    for block in blocks:
        parent = block_hash(parent, block)
        hashes.append(parent)
    return hashes


def pack(token_ids: Sequence[int]) -> bytes:
    """Token ids as little-endian int32 bytes, the chain's block encoding."""
    try:
        return struct.pack(f"<{len(token_ids)}i", *token_ids)
    except struct.error:
        bad = next((t for t in token_ids if not isinstance(t, int) or not _INT32[0] <= t <= _INT32[1]), None)
        raise BadTokenId(f"token id {bad!r} is not a 32-bit integer") from None
