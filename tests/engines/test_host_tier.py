"""The host-memory tier below the KV pool: the block manager with a tier over small real caches,
then the engine with the real SmolLM2 (deterministic mode): a tier hit gives the same tokens."""

from __future__ import annotations

import random

import pytest
import torch

from contracts.kv_events import MEDIUM_HOST, MEDIUM_POOL
from engines.builtin.config import EngineConfig
from engines.builtin.engine.block_manager import BlockManager
from engines.builtin.engine.host_tier import HostTier, KVBlockIO, TierBlock
from engines.builtin.engine.kv_pins import KVPins
from engines.builtin.engine.llm_engine import LLMEngine
from engines.builtin.engine.sequence import Sequence
from engines.builtin.runner.model_runner import ModelRunner
from engines.sampling_params import SamplingParams
from tests.engines.test_llm_engine import assert_no_leak, greedy, run, tokens_of

BS = 4
LAYERS = 3


def caches(num_blocks: int) -> list[torch.Tensor]:
    return [torch.zeros(num_blocks, BS, 2, 1, 2) for _ in range(LAYERS)]


def make(num_blocks: int, tier_blocks: int, dtype: torch.dtype | None = None) -> tuple[BlockManager, KVBlockIO]:
    io = KVBlockIO(caches(num_blocks))
    return BlockManager(num_blocks, BS, host_tier=HostTier(io, tier_blocks, dtype)), io


def value(token: int, pos: int, layer: int) -> float:
    return token + pos / 16 + layer / 8  # within float16's range


def serve(bm: BlockManager, io: KVBlockIO, request_id: str, tokens: list[int], salt: str = "t") -> Sequence:
    """Allocate, 'compute' every position (KV = a function of token and position), register, free."""
    seq = Sequence(request_id, list(tokens), SamplingParams(max_tokens=1), salt)
    cached = bm.allocate(seq)
    for pos in range(cached, len(tokens)):
        block, slot = seq.block_table[pos // BS], pos % BS
        for layer, cache in enumerate(io.caches):
            cache[block, slot] = value(tokens[pos], pos, layer)
    seq.num_computed_tokens = len(seq)
    bm.commit_computed(seq)
    bm.deallocate(seq)
    return seq


def kv_of(io: KVBlockIO, seq_blocks: list[int], length: int) -> list[float]:
    return [float(io.caches[layer][seq_blocks[p // BS], p % BS, 0, 0, 0]) for layer in range(LAYERS) for p in range(length)]


def test_evicted_blocks_come_back_from_the_tier_with_their_kv() -> None:
    bm, io = make(num_blocks=4, tier_blocks=8)
    first = list(range(100, 113))  # 3 full blocks + 1 token
    serve(bm, io, "a", first)
    bm.events.drain()
    serve(bm, io, "b", list(range(200, 213)))  # needs all 4 blocks: a's 3 cached blocks go to the tier
    events = bm.events.drain()
    assert {e.medium for e in events if e.kind == "stored"} == {MEDIUM_POOL, MEDIUM_HOST}
    assert len(bm.host_tier) == 3  # type: ignore[arg-type]
    seq = Sequence("c", list(first), SamplingParams(max_tokens=1), "t")
    assert bm.allocate(seq) == 12  # (13 - 1) // 4 blocks: all three, copied back
    assert kv_of(io, seq.block_table, 12) == [value(t, p, layer) for layer in range(LAYERS) for p, t in enumerate(first[:12])]
    counters = bm.host_tier.snapshot()  # type: ignore[union-attr]
    assert counters.num_hit_blocks == 3 and counters.num_bytes_out == 3 * LAYERS * BS * 2 * 2 * 4
    bm.deallocate(seq)
    other = Sequence("d", list(first), SamplingParams(max_tokens=1), "another tenant")
    assert bm.allocate(other) == 0  # salted: another tenant finds nothing in the tier either
    bm.deallocate(other)


def test_tier_size_is_respected_under_churn_and_no_block_leaks() -> None:
    bm, io = make(num_blocks=6, tier_blocks=5)
    rng = random.Random(0)
    prompts = [[rng.randrange(1000) for _ in range(rng.randrange(5, 20))] for _ in range(12)]
    for i in range(200):
        serve(bm, io, f"r{i}", prompts[rng.randrange(len(prompts))], salt=f"t{i % 3}")
        assert len(bm.host_tier) <= 5  # type: ignore[arg-type]
    counters = bm.host_tier.snapshot()  # type: ignore[union-attr]
    assert counters.num_hit_blocks > 0 and counters.num_evicted_blocks > 0
    assert bm.num_free_blocks == bm.num_blocks and all(b.ref_count == 0 for b in bm.blocks)
    assert not set(bm.hash_to_block) & set(bm.host_tier.entries)  # type: ignore[union-attr]  # one place each


def test_float16_storage_halves_the_bytes_within_its_rounding() -> None:
    bm, io = make(num_blocks=4, tier_blocks=8, dtype=torch.float16)
    first = list(range(100, 113))
    serve(bm, io, "a", first)
    serve(bm, io, "b", list(range(200, 213)))
    entry = next(iter(bm.host_tier.entries.values()))  # type: ignore[union-attr]
    assert entry.data.dtype == torch.float16
    seq = Sequence("c", list(first), SamplingParams(max_tokens=1), "t")
    assert bm.allocate(seq) == 12
    expected = [value(t, p, layer) for layer in range(LAYERS) for p, t in enumerate(first[:12])]
    assert kv_of(io, seq.block_table, 12) == pytest.approx(expected, rel=2**-11)


@pytest.mark.parametrize("extra", [0, 1])
def test_greedy_output_after_a_tier_hit_equals_a_cold_run(smollm2_runner: ModelRunner, extra: int) -> None:
    tok = smollm2_runner.tokenizer
    text = ("The history of the printing press begins in Mainz, where Johannes Gutenberg combined movable "
            "metal type, oil-based ink and a wooden press around the year 1440. Within fifty years printers worked "
            "in more than two hundred cities, from Venice and Paris to London and Krakow, and books became cheap.")
    prompt = tok.encode(text)[: 3 * 16 + extra]  # block-boundary lengths: 48 (2 blocks reusable) and 49 (3)
    assert len(prompt) == 3 * 16 + extra
    filler = tok.encode("Volcanoes form where magma from the mantle reaches the surface, often along the edges "
                        "of tectonic plates or above hot spots such as the one under Hawaii today. Their eruptions build islands, "
                        "bury cities and cool the planet for a year or two when their ash reaches the stratosphere.") * 2
    filler = filler[:60]
    # A pool with room for one request: the filler evicts the prompt's blocks into the tier.
    config = EngineConfig(block_size=16, num_kv_blocks=5, mode="deterministic", host_tier_blocks=16)
    engine = LLMEngine(config, smollm2_runner)
    assert len(filler) == 60
    cold = run(engine, greedy("cold", prompt, max_tokens=12, salt="t1"))["cold"]
    run(engine, greedy("filler", filler, max_tokens=12, salt="t1"))
    warm = run(engine, greedy("warm", prompt, max_tokens=12, salt="t1"))["warm"]
    tier = engine.stats().host_tier
    assert tier is not None and tier.num_hit_blocks == (len(prompt) - 1) // 16
    assert warm[-1].num_cached_tokens == (len(prompt) - 1) // 16 * 16
    assert tokens_of(warm) == tokens_of(cold)
    assert_no_leak(engine)


def test_fetched_blocks_land_in_the_tier_without_pushing_out_the_prompts_own() -> None:
    bm, io = make(num_blocks=4, tier_blocks=4)
    first = list(range(100, 113))
    serve(bm, io, "a", first)
    serve(bm, io, "b", list(range(200, 213)))  # a's three blocks go to the tier
    tier = bm.host_tier
    assert tier is not None
    own = list(tier.entries)
    fetched = [TierBlock(1000, None, (7,) * BS, torch.zeros(LAYERS, BS, 2, 1, 2))]  # what room is left: 4 - 3
    pooled = TierBlock(next(iter(bm.hash_to_block)), None, (0,) * BS, torch.zeros(LAYERS, BS, 2, 1, 2))
    assert bm.admit_fetched([pooled, *fetched], keep=own) == 1  # the one in the pool already is skipped
    assert list(tier.entries) == [*own, 1000]


def test_pinned_and_running_blocks_never_move_to_the_tier() -> None:
    bm, io = make(num_blocks=8, tier_blocks=16)
    pins = KVPins(bm)
    held = Sequence("held", list(range(300, 309)), SamplingParams(max_tokens=1), "t")  # running: keeps its blocks
    bm.allocate(held)
    held.num_computed_tokens = len(held)
    bm.commit_computed(held)
    pinned = Sequence("pinned", list(range(400, 409)), SamplingParams(max_tokens=1), "t")
    bm.allocate(pinned)
    pinned.num_computed_tokens = len(pinned)
    bm.commit_computed(pinned)
    pin = pins.pin(pinned)  # a context step's KV, waiting for a decode backend
    kept = set(held.block_table) | set(pin.block_ids)
    for i in range(30):  # churn through the 2 blocks left
        serve(bm, io, f"r{i}", [500 + i] * 5, salt=f"t{i}")
    tier = bm.host_tier
    assert tier is not None and len(tier) > 0
    assert not {bm.blocks[b].hash for b in kept} & set(tier.entries)  # never copied down
    assert all(bm.blocks[b].ref_count == 1 for b in kept)
    pins.release(pin.pin_id)
    bm.deallocate(held)
    assert bm.num_free_blocks == bm.num_blocks and all(b.ref_count == 0 for b in bm.blocks)
