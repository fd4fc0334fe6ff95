"""Attention over a paged KV cache, with torch's scaled_dot_product_attention.

One cache tensor per layer, shaped [num_blocks, block_size, 2, num_kv_heads, head_dim] (k and v of a
position side by side, so the new k/v rows of a step are written with one index_copy_). A token at
position `pos` of a sequence lives in slot `block_table[pos // block_size] * block_size + pos % block_size`.

Rows of a packed batch are ordered decodes first (items with one new token, shortest context first),
then prefill chunks. Decodes run in groups of similar context length, one batched SDPA call per group
over its gathered blocks (padded to the group's longest context and masked; grouped-query attention
needs no copies of k/v there: the query heads sharing a kv head are folded into the query-length
axis). Grouping keeps one long sequence from padding every short one to its length: four 60-token
streams next to one 1,500-token prompt gathered and attended 7,500 keys a layer instead of 1,740.
Each prefill chunk runs alone, causal inside the chunk and fully attending to its cached prefix, with
SDPA's own grouped-query support (4-D inputs, so that the CPU flash-attention kernel runs it).

Where the runner says so (`AttentionMetadata.paged_decodes`: the fast mode on a float32 CPU cache with
edgerun's kernels loaded), the decode rows skip the gather and SDPA: one call of edgerun's
`paged_decode_attention` (kernels/paged_attention.cpp) per layer reads each row's keys and values where they
lie in the cache. At 16 streams the gather and SDPA were about a third of a step's CPU on the torch path.

On CUDA, every attention call runs inside `attention_backends(device)`: SDPA without cuDNN's kernel.
On Hopper torch tries cuDNN first, and cuDNN builds a graph for each new shape; a decode step brings
a new context length every time, so each layer's call paid a build (1.8 ms of CPU per call on an
H200: random:llama-8b ran 70 ms per batch-1 step on lengths not seen before, 13 ms on seen ones).
Flash and memory-efficient attention take any length as it comes: decoding 16 and 64 streams ran
1.16x and 1.21x faster even against cuDNN's cached graphs, a 1,000-token prefill of an already seen
length 10% slower (BENCHMARKS.md, "On a lent GPU machine").
"""

from __future__ import annotations

import contextlib
import math
import mmap
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

CUDA_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def attention_backends(device: torch.device) -> AbstractContextManager[None]:
    """The SDPA kernels attention may use on `device` (on CUDA all but cuDNN's; see above)."""
    return sdpa_kernel(CUDA_SDPA_BACKENDS) if device.type == "cuda" else contextlib.nullcontext()


@dataclass(slots=True)
class PrefillChunk:
    start: int  # first row of the chunk in the packed batch
    end: int
    block_table: Tensor | slice  # [ceil(num_context / block_size)] long, or a contiguous run of blocks
    num_context: int  # cached prefix + this chunk
    mask: Tensor | None  # [n, num_context] bool, True = attend; None when the chunk starts the sequence (causal)


@dataclass(slots=True)
class DecodeGroup:
    start: int  # rows [start, end) of the packed batch: single-token items of similar context length
    end: int
    block_tables: Tensor | slice  # [B, max_blocks] long, padded with block 0; a run when B == 1
    num_context: int  # keys per row: the group's longest context
    mask: Tensor | None  # [B, 1, 1, num_context] bool; None when every row uses all keys


@dataclass(slots=True)
class PagedDecodes:
    """The decode rows for edgerun's paged_decode_attention: every row's keys where they lie in the cache."""

    context_lens: Tensor  # [num_decodes] long: keys per row (its position + 1)
    block_tables: Tensor  # [num_decodes, max_blocks] long, each row's blocks padded with block 0


@dataclass(slots=True)
class AttentionMetadata:
    slot_mapping: Tensor  # [T] long: cache slot of each new token
    num_decodes: int  # rows [0, num_decodes) are single-token items
    decode_groups: list[DecodeGroup]  # covering rows [0, num_decodes) in order; [] when paged_decodes is set
    prefills: list[PrefillChunk]
    paged_decodes: PagedDecodes | None = None  # set: the decode rows run through edgerun's kernel instead of SDPA


def allocate_kv_caches(
    num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
    dtype: torch.dtype, device: torch.device,
) -> list[Tensor]:
    # Zeroed, not empty: padded or masked keys still meet the values with weight 0, and 0 * NaN is NaN.
    shape = (num_blocks, block_size, 2, num_kv_heads, head_dim)
    if device.type != "cpu":
        return [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
    # On the CPU, anonymous memory maps come zeroed from the kernel page by page as they are first
    # touched, so a large cache costs nothing at start (torch.zeros would write every byte now).
    nbytes = math.prod(shape) * dtype.itemsize
    return [torch.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype).view(shape) for _ in range(num_layers)]


def write_kv(kv_cache: Tensor, kv_new: Tensor, meta: AttentionMetadata) -> None:
    # kv_new: [T, 2, KH, hd] -> cache slots meta.slot_mapping
    kv_cache.view(-1, *kv_new.shape[1:]).index_copy_(0, meta.slot_mapping, kv_new)


def read_blocks(kv_cache: Tensor, blocks: Tensor | slice) -> Tensor:
    # blocks [..., nb] -> [..., nb, block_size * 2 * KH * hd]. A contiguous run of blocks (a lone
    # sequence's usual layout) is a view, no copy; otherwise a gather, with embedding: it copies whole
    # rows, much faster on CPU than advanced indexing
    flat = kv_cache.view(kv_cache.shape[0], -1)
    return flat[blocks] if isinstance(blocks, slice) else F.embedding(blocks, flat)


def paged_attention(q: Tensor, kv_cache: Tensor, meta: AttentionMetadata) -> Tensor:
    # q: [T, H*hd] -> [T, H*hd]
    outs = []
    if meta.num_decodes:
        outs.append(decode_attention(q[: meta.num_decodes], kv_cache, meta))
    for chunk in meta.prefills:
        outs.append(prefill_attention(q[chunk.start : chunk.end], kv_cache, chunk))
    return outs[0] if len(outs) == 1 else torch.cat(outs)


def decode_attention(q: Tensor, kv_cache: Tensor, meta: AttentionMetadata) -> Tensor:
    # q: [num_decodes, H*hd], one token per sequence -> [num_decodes, H*hd]
    paged = meta.paged_decodes
    if paged is not None:
        out: Tensor = torch.ops.edgerun.paged_decode_attention(q, kv_cache, paged.context_lens, paged.block_tables)
        return out
    outs = [decode_group_attention(q[group.start : group.end], kv_cache, group) for group in meta.decode_groups]
    return outs[0] if len(outs) == 1 else torch.cat(outs)


def decode_group_attention(q: Tensor, kv_cache: Tensor, group: DecodeGroup) -> Tensor:
    # q: [B, H*hd], one token per sequence -> [B, H*hd]
    num_seqs = q.shape[0]
    _, _, _, kh, hd = kv_cache.shape
    kv = read_blocks(kv_cache, group.block_tables).view(num_seqs, -1, 2, kh, hd)[:, : group.num_context]  # [B, L, 2, KH, hd]
    k, v = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)  # [B, KH, L, hd]
    q = q.view(num_seqs, kh, -1, hd)  # [B, KH, G, hd]: the G query heads of a kv head act as G queries
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=group.mask)  # [B, KH, G, hd]
    return out.reshape(num_seqs, -1)


def prefill_attention(q: Tensor, kv_cache: Tensor, chunk: PrefillChunk) -> Tensor:
    # q: [n, H*hd], the chunk's tokens of one sequence -> [n, H*hd]
    n = q.shape[0]
    _, _, _, kh, hd = kv_cache.shape
    kv = read_blocks(kv_cache, chunk.block_table).view(-1, 2, kh, hd)[: chunk.num_context]  # [ctx, 2, KH, hd]
    # Strided views of the cache, as 4-D [1, heads, len, hd]: torch's CPU flash-attention kernel (blocked,
    # online softmax, grouped-query aware, reads any strides) only takes 4-D inputs. With 3-D ones SDPA
    # falls back to its math path, which materialises the [H, n, ctx] scores and ran a 1,000-token prefill's
    # attention ~10x slower.
    k, v = kv[None, :, 0].transpose(1, 2), kv[None, :, 1].transpose(1, 2)  # [1, KH, ctx, hd]
    q = q.view(1, n, -1, hd).transpose(1, 2)  # [1, H, n, hd]
    if chunk.mask is None:  # no cached prefix: plain causal attention within the chunk
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=chunk.mask, enable_gqa=True)  # [1, H, n, hd]
    return out[0].transpose(0, 1).reshape(n, -1)
