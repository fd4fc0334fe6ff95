"""Tenant-salted prefix hashing for routing: the chain of `contracts.prefix_hash`, keyed by tenant.

The encoding lives in `contracts/prefix_hash.py` (the engine hashes its KV blocks with the same
code, so its KV events name the blocks the gateway's prefix index computes). Here the chain
is rooted at a tenant id, which must not be empty, and bad input is a `PolicyError`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from contracts import prefix_hash
from contracts.prefix_hash import BadTokenId
from policies.errors import PolicyError


def tenant_salt(tenant: str) -> int:
    """The chain's root for `tenant`: the same 64-bit form as a block hash."""
    _check_tenant(tenant)
    return prefix_hash.salt_root(tenant)


def chain_hashes(tenant: str, blocks: Iterable[Sequence[int]]) -> list[int]:
    """Hash already-cut blocks (of any one fixed size) as a tenant-salted chain."""
    _check_tenant(tenant)
    try:
        return prefix_hash.chain_of_blocks(blocks, tenant)
    except BadTokenId as e:
        raise PolicyError(str(e)) from None


def block_hashes(token_ids: Sequence[int], block_size: int, tenant: str) -> list[int]:
    """The chain for a prompt's full blocks of `block_size` tokens (a partial tail is left out)."""
    if block_size < 1:
        raise PolicyError(f"block_size={block_size} must be >= 1")
    _check_tenant(tenant)
    try:
        return prefix_hash.chain_hashes(token_ids, block_size, tenant)
    except BadTokenId as e:
        raise PolicyError(str(e)) from None


def _check_tenant(tenant: str) -> None:
    if not tenant:
        raise PolicyError("tenant must be a non-empty string to salt the prefix chain")
