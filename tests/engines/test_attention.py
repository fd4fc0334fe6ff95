"""Attention over the paged cache: prefill chunks (SDPA, on its fast kernel) and decode rows through edgerun's
paged_decode_attention give the same numbers as plain attention."""

from __future__ import annotations

import math

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from engines.builtin.runner import kernels
from engines.builtin.runner.attention import (
    AttentionMetadata,
    PagedDecodes,
    PrefillChunk,
    decode_attention,
    prefill_attention,
)
from engines.builtin.runner.model_runner import ForwardItem, ModelRunner

H, KH, HD, BLOCK = 6, 2, 16, 4


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
    # q [n, H*hd], k/v [ctx, KH, hd], query t at position start + t -> [n, H*hd], plain float64 softmax attention
    n, ctx = q.shape[0], k.shape[0]
    qh = q.double().view(n, H, HD).transpose(0, 1)  # [H, n, hd]
    kh = k.double().repeat_interleave(H // KH, dim=1).transpose(0, 1)  # [H, ctx, hd]
    vh = v.double().repeat_interleave(H // KH, dim=1).transpose(0, 1)
    scores = qh @ kh.transpose(1, 2) / math.sqrt(HD)  # [H, n, ctx]
    visible = torch.arange(ctx)[None, :] <= torch.arange(start, start + n)[:, None]
    out = scores.masked_fill(~visible, float("-inf")).softmax(-1) @ vh  # [H, n, hd]
    return out.transpose(0, 1).reshape(n, H * HD)


def chunk_inputs(start: int, n: int, table: list[int]) -> tuple[torch.Tensor, torch.Tensor, PrefillChunk]:
    torch.manual_seed(start * 100 + n)
    cache = torch.randn(16, BLOCK, 2, KH, HD)
    ctx = start + n
    mask = None if start == 0 else torch.arange(ctx)[None, :] <= torch.arange(start, ctx)[:, None]
    blocks: torch.Tensor | slice = torch.tensor(table)
    if table == list(range(table[0], table[0] + len(table))):
        blocks = slice(table[0], table[0] + len(table))
    return torch.randn(n, H * HD), cache, PrefillChunk(0, n, blocks, ctx, mask)


@pytest.mark.parametrize(("start", "n", "table"), [
    (0, 13, [2, 3, 4, 5]),  # a fresh prompt in a contiguous run of blocks: causal
    (0, 13, [9, 1, 7, 4]),  # scattered blocks: gathered
    (6, 7, [5, 6, 7, 8]),  # a chunk after a cached prefix: masked
    (11, 1, [8, 2, 3]),  # one query row (a verify row's shape)
])
def test_prefill_attention_matches_plain_attention(start: int, n: int, table: list[int]) -> None:
    q, cache, chunk = chunk_inputs(start, n, table)
    kv = cache.view(-1, 2, KH, HD)[torch.tensor([b * BLOCK + i for b in table for i in range(BLOCK)])][: start + n]
    expected = reference(q, kv[:, 0], kv[:, 1], start)
    torch.testing.assert_close(prefill_attention(q, cache, chunk).double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("start", [0, 6])
def test_prefill_attention_runs_the_flash_kernel(start: int) -> None:
    """SDPA falls back to its math path (all scores materialised, ~10x slower on a 1,000-token
    prefill) for inputs that are not 4-D; the CPU flash kernel must run both the causal and the
    masked chunk."""
    q, cache, chunk = chunk_inputs(start, 10, [0, 1, 2, 3, 4])
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        prefill_attention(q, cache, chunk)
    ops = {event.key for event in prof.key_averages()}
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in ops
    assert "aten::_scaled_dot_product_attention_math" not in ops


# ---- decode rows through edgerun's kernel ---------------------------------------------------------------------

needs_kernels = pytest.mark.skipif(not kernels.load(), reason="edgerun's kernels need x86 AVX2, FMA, F16C and a compiler")


def decode_inputs(contexts: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, list[list[int]]]:
    # rows of one query token at contexts (keys per row), each over its own scattered blocks of a 40-block cache
    gen = torch.Generator().manual_seed(seed)
    cache = torch.randn(40, BLOCK, 2, KH, HD, generator=gen)
    order = torch.randperm(40, generator=gen).tolist()
    tables, used = [], 0
    for ctx in contexts:
        n = math.ceil(ctx / BLOCK)
        tables.append(order[used : used + n])
        used += n
    # q as the runner hands it: a strided view of a wider qkv buffer
    qkv = torch.randn(len(contexts), (H + 2 * KH) * HD, generator=gen)
    return qkv[:, : H * HD], cache, tables


def paged_meta(contexts: list[int], tables: list[list[int]]) -> AttentionMetadata:
    width = max(len(t) for t in tables)
    padded = torch.tensor([t + [0] * (width - len(t)) for t in tables])
    paged = PagedDecodes(torch.tensor(contexts), padded)
    return AttentionMetadata(torch.zeros(len(contexts), dtype=torch.long), len(contexts), [], [], paged)


@needs_kernels
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("contexts", [[1], [4, 5, 17, 40], [33, 1, 12, 60, 8, 9, 2]])
def test_paged_decode_attention_matches_plain_attention(contexts: list[int], threads: int) -> None:
    q, cache, tables = decode_inputs(contexts)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = decode_attention(q, cache, paged_meta(contexts, tables))
    finally:
        torch.set_num_threads(before)
    assert out.shape == (len(contexts), H * HD)
    for row, (ctx, table) in enumerate(zip(contexts, tables)):
        kv = cache[torch.tensor(table)].reshape(-1, 2, KH, HD)[:ctx]
        expected = reference(q[row : row + 1], kv[:, 0], kv[:, 1], ctx - 1)
        torch.testing.assert_close(out[row : row + 1].double(), expected, atol=1e-5, rtol=1e-5)


@needs_kernels
def test_paged_decode_attention_refuses_a_context_past_its_blocks() -> None:
    q, cache, tables = decode_inputs([20])
    with pytest.raises(RuntimeError, match="outside its block table"):
        decode_attention(q, cache, paged_meta([20 + 2 * BLOCK], tables))
    with pytest.raises(RuntimeError, match="block id out of range"):
        decode_attention(q, cache, paged_meta([20], [tables[0][:-1] + [40]]))


def test_the_default_runner_attends_decode_rows_through_the_kernel_where_it_runs_fused(
        smollm2_default_runner: ModelRunner, tiny_runner: ModelRunner) -> None:
    """The fast mode's runner with edgerun's kernels gives its decode rows to paged_decode_attention (no SDPA
    groups); the exact mode's runner keeps SDPA; the logits of both kinds of step agree with the runner's own
    SDPA path: the fast mode quantizes each linear's input to int16 per block, so float32 rounding in attention
    can move a quantization step and the logits by ~1e-4 of their range, never the top token."""
    runner = smollm2_default_runner
    assert not tiny_runner.paged_decode
    table = list(range(200, 220))
    tiny_items = [ForwardItem([7], 9, table[:1])]
    assert tiny_runner.prepare_batch(tiny_items).meta.paged_decodes is None
    if runner.fused is None:
        pytest.skip("edgerun's kernels do not run here")
    assert runner.paged_decode
    prompts = [[11 + i % 90 for i in range(n)] for n in (5, 40, 17, 70, 2, 33)]
    tables = [list(range(100 + 10 * i, 110 + 10 * i)) for i in range(len(prompts))]
    for prompt, t in zip(prompts, tables):
        runner.execute([ForwardItem(prompt, 0, t)])
    items = [ForwardItem([300 + i], len(p), t) for i, (p, t) in enumerate(zip(prompts, tables))]
    meta = runner.prepare_batch(items).meta
    assert meta.paged_decodes is not None and meta.decode_groups == []
    kernel = runner.run_forward(items, ()).logits
    runner.paged_decode = False
    try:
        sdpa = runner.run_forward(items, ()).logits
    finally:
        runner.paged_decode = True
    assert (kernel - sdpa).abs().max() <= 1e-3 * sdpa.abs().max()
    assert torch.equal(kernel.argmax(-1), sdpa.argmax(-1))
