"""The KV pool a region's backends share, on Mooncake Store: keys, values and the client's calls.

Every backend of a region runs a Mooncake Store client (`mooncake.store`, in the
`mooncake-transfer-engine-non-cuda` package) against the region's `mooncake_master` and lends it
`segment_mb` of its memory; an object put by one backend lives in some backend's segment and any
other reads it over the Transfer Engine (TCP here). The master only keeps metadata.

Keys: `edgerun/<fingerprint>/<storage dtype>/<chain hash>`. The fingerprint (layout.py) names the
model, layer count, KV heads, head size, block size, cache dtype and layout, so a backend whose
cache differs in any of them never reads a block it cannot use. The chain hash is the tenant-salted
one of `contracts.prefix_hash`: a tenant's blocks are found only by its own salted hashes.

Values: a header (magic, parent hash, token count), the block's token ids (int32, checked on
every read: a hash is 64 bits, the tokens are the proof), then its K and V for every layer,
[num_layers, block_size, 2, kv_heads, head_dim] in the storage dtype.

Each call goes to one worker thread (the client is used from one thread) and returns a plain
result; failures come back as `PoolUnavailable`, which the caller answers by serving from its
own tiers.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import torch

from engines.builtin.engine.host_tier import TierBlock

MAGIC = b"ERKV"
_HEADER = struct.Struct("<4sqI")  # magic, parent hash (signed 64), token count


class PoolUnavailable(RuntimeError):
    """The region's pool could not be reached or refused the call."""


@dataclass(slots=True, frozen=True)
class BlockCodec:
    fingerprint: str
    block_shape: tuple[int, ...]  # [num_layers, block_size, 2, kv_heads, head_dim]
    dtype: torch.dtype

    def key(self, block_hash: int) -> str:
        return f"edgerun/{self.fingerprint}/{str(self.dtype).removeprefix('torch.')}/{block_hash & (2**64 - 1):016x}"

    def encode(self, block: TierBlock) -> bytes:
        parent = block.parent_hash if block.parent_hash is not None else 0
        header = _HEADER.pack(MAGIC, parent, len(block.token_ids))
        tokens = struct.pack(f"<{len(block.token_ids)}i", *block.token_ids)
        data = block.data.to(self.dtype).contiguous().view(torch.uint8).numpy().tobytes()
        return header + tokens + data

    def decode(self, block_hash: int, value: bytes) -> TierBlock | None:
        """The block, or None when the value is not one of this layout's (or its size is off)."""
        if len(value) < _HEADER.size:
            return None
        magic, parent, num_tokens = _HEADER.unpack_from(value)
        start = _HEADER.size + 4 * num_tokens
        num_values = 1
        for n in self.block_shape:
            num_values *= n
        if magic != MAGIC or len(value) != start + num_values * self.dtype.itemsize:
            return None
        tokens = struct.unpack_from(f"<{num_tokens}i", value, _HEADER.size)
        data = torch.frombuffer(bytearray(value[start:]), dtype=self.dtype).view(self.block_shape)
        return TierBlock(block_hash, parent, tokens, data)


class MooncakePool:
    """A Mooncake Store client: `setup` once, then batches of exists / get / put. Blocking calls:
    the caller runs them on its one worker thread."""

    def __init__(self, master: str, local_host: str, segment_bytes: int, buffer_bytes: int) -> None:
        self.master = master
        self.local_host = local_host
        self.segment_bytes = segment_bytes
        self.buffer_bytes = buffer_bytes
        self._store: Any = None

    @property
    def is_set_up(self) -> bool:
        return self._store is not None

    def setup(self) -> None:
        from mooncake.store import MooncakeDistributedStore  # optional dependency (extra "kv")

        store = MooncakeDistributedStore()
        rc = store.setup(self.local_host, "P2PHANDSHAKE", self.segment_bytes, self.buffer_bytes, "tcp", "",
                         self.master)
        if rc != 0:
            raise PoolUnavailable(f"the Mooncake Store client could not join the master at {self.master} (rc {rc})")
        self._store = store

    def leading_run(self, keys: list[str]) -> int:
        """How many of `keys`, from the first, the pool holds without a gap."""
        flags = self._call().batch_is_exist(keys)
        if any(f < 0 for f in flags[:1]):
            raise PoolUnavailable(f"the Mooncake master at {self.master} did not answer (rc {flags[0]})")
        run = 0
        for flag in flags:
            if flag != 1:
                break
            run += 1
        return run

    def missing(self, keys: list[str]) -> list[int]:
        """Indices of `keys` the pool does not hold."""
        flags = self._call().batch_is_exist(keys)
        if flags and all(f < 0 for f in flags):
            raise PoolUnavailable(f"the Mooncake master at {self.master} did not answer (rc {flags[0]})")
        return [i for i, flag in enumerate(flags) if flag != 1]

    def get(self, keys: list[str]) -> list[bytes]:
        return list(self._call().get_batch(keys))

    def put(self, keys: list[str], values: list[bytes]) -> None:
        rc = self._call().put_batch(keys, values)
        if rc != 0:
            raise PoolUnavailable(f"the Mooncake pool refused {len(keys)} blocks (rc {rc})")

    def close(self) -> None:
        if self._store is not None:
            store, self._store = self._store, None
            store.close()

    def _call(self) -> Any:
        if self._store is None:
            raise PoolUnavailable("the Mooncake Store client is not set up")
        return self._store
