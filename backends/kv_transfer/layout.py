"""The bytes of KV blocks, as both ends of a transfer see them.

The built-in engine's cache is one tensor per layer, [num_blocks, block_size, 2, kv_heads,
head_dim], so block b of layer l is one contiguous run of bytes. A transfer sends the blocks of
a request layer by layer, block by block in table order; each side maps that stream onto its
own block ids, merging consecutive ids into one segment, so no byte is copied on the way
(segments are memoryviews into the cache; sockets read and write them directly).

Two backends may exchange blocks only if their fingerprints agree: model, layer count, KV
heads, head size, block size, dtype and this layout.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

LAYOUT = "layer-major;block,slot,kv,head,dim"


@dataclass(slots=True)
class KVLayout:
    caches: list[torch.Tensor]  # one per layer: [num_blocks, block_size, 2, kv_heads, head_dim]
    fingerprint: str

    @classmethod
    def of(cls, caches: list[torch.Tensor], model_name: str) -> KVLayout:
        first = caches[0]
        if first.device.type != "cpu":
            raise ValueError("KV transfer reads the cache in host memory: the built-in engine on CPU")
        _, block_size, _, kv_heads, head_dim = first.shape
        identity = f"{model_name}|layers={len(caches)}|kv_heads={kv_heads}|head_dim={head_dim}|"
        identity += f"block_size={block_size}|dtype={first.dtype}|{LAYOUT}"
        return cls(caches, hashlib.sha256(identity.encode()).hexdigest()[:32])

    @property
    def block_nbytes(self) -> int:
        """Bytes of one block in one layer."""
        first = self.caches[0]
        return first[0].numel() * first.element_size()

    def nbytes(self, num_blocks: int) -> int:
        return num_blocks * self.block_nbytes * len(self.caches)

    def segments(self, block_ids: list[int]) -> list[memoryview]:
        """Writable views of `block_ids` in wire order (layer-major), consecutive ids merged."""
        views = []
        for cache in self.caches:
            flat = cache.view(cache.shape[0], -1).view(torch.uint8)  # [num_blocks, block bytes]
            array = flat.numpy()
            views += [array[start:stop].data.cast("B") for start, stop in _runs(block_ids)]
        return views

    def addresses(self, block_ids: list[int]) -> list[tuple[int, int]]:
        """(address, length) of each segment, in the same order (for RDMA-style transports)."""
        out = []
        size = self.block_nbytes
        for cache in self.caches:
            base = cache.data_ptr()
            out += [(base + start * size, (stop - start) * size) for start, stop in _runs(block_ids)]
        return out


def _runs(block_ids: list[int]) -> Iterator[tuple[int, int]]:
    """[start, stop) ranges of consecutive ids, in order."""
    i = 0
    while i < len(block_ids):
        j = i + 1
        while j < len(block_ids) and block_ids[j] == block_ids[j - 1] + 1:
            j += 1
        yield block_ids[i], block_ids[j - 1] + 1
        i = j
