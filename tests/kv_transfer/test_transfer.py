"""KV transfer between two real engines in this process, over real loopback sockets, on both
transports: a context step's pinned blocks arrive byte for byte, generation continues exactly as
if collocated, pins are released on pull or expiry, and bad pulls are refused before any write.

The engines run a seeded random 2-layer Llama (the same weights in both), so the test is fast;
the real model goes through the same code in tests/gateway/e2e/test_disagg.py.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import pytest_asyncio
import torch

from backends.kv_transfer.channel import KVChannel, MooncakeChannel, TcpChannel
from backends.kv_transfer.errors import FingerprintMismatch, PinNotFound, TransferRefused
from backends.kv_transfer.exports import KVExports
from backends.kv_transfer.layout import KVLayout
from backends.kv_transfer.opaque import OpaqueState
from backends.kv_transfer.tcp import TcpExporter
from engines.base import GenerationOutput, GenerationRequest, KVPin
from engines.builtin.config import EngineConfig
from engines.builtin.engine.async_engine import AsyncEngine
from engines.builtin.engine.kv_handoff import ImportPlan
from engines.builtin.runner.model_runner import ModelRunner
from engines.sampling_params import SamplingParams

SECRET = b"kv-test-secret-0123456789abcdef"
CONFIG = EngineConfig(model="random:tiny", num_kv_blocks=64, weight_dtype="float32", max_num_batched_tokens=32)
# Installed (make installs it): tested, and a broken install fails. Absent: skipped, except under CI=true.
MOONCAKE_SKIP = importlib.util.find_spec("mooncake") is None and os.environ.get("CI") != "true"
TRANSPORTS = ["tcp", pytest.param("mooncake", marks=pytest.mark.skipif(
    MOONCAKE_SKIP, reason="mooncake-transfer-engine-non-cuda is not installed (pip install -e '.[kv]', with the "
    "Debian packages libibverbs1 librdmacm1 libnuma1 liburing2: see the Makefile)"))]


@pytest.fixture(scope="module")
def runners() -> tuple[ModelRunner, ModelRunner]:
    return ModelRunner(CONFIG), ModelRunner(CONFIG)  # same seed: the same weights, separate KV caches


@dataclass
class Pair:
    prefill: AsyncEngine
    decode: AsyncEngine
    exports: KVExports
    exporter: TcpExporter
    channel: KVChannel

    def opaque(self, pin: KVPin) -> OpaqueState:
        return OpaqueState(self.channel.name, "127.0.0.1", self.exporter.port, pin.pin_id, pin.num_tokens,
                           len(pin.block_ids), self.exporter.layout.fingerprint, self.channel.opaque_extra(pin.block_ids))


pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=TRANSPORTS)
async def pair(request: pytest.FixtureRequest, runners: tuple[ModelRunner, ModelRunner]) -> AsyncIterator[Pair]:
    prefill, decode = AsyncEngine(CONFIG, runners[0]), AsyncEngine(CONFIG, runners[1])
    await prefill.start()
    await decode.start()
    release = lambda pin_id: prefill.call(lambda engine: engine.pins.release(pin_id))  # noqa: E731
    exports = KVExports(ttl_s=30.0, release=release)
    prefill_layout = KVLayout.of(runners[0].kv_caches, prefill.model_name)
    exporter = TcpExporter(prefill_layout, exports, SECRET, "127.0.0.1")
    await exporter.start()
    decode_layout = KVLayout.of(runners[1].kv_caches, decode.model_name)
    if request.param == "mooncake":
        # one Mooncake engine per process in a deployment; here each side needs its own registered memory
        exporter_side = MooncakeChannel(prefill_layout, SECRET, "127.0.0.1")
        channel: KVChannel = MooncakeChannel(decode_layout, SECRET, "127.0.0.1")
        channel.opaque_extra = exporter_side.opaque_extra  # type: ignore[method-assign]  # the exporter describes its memory
    else:
        channel = TcpChannel(decode_layout, SECRET)
    try:
        yield Pair(prefill, decode, exports, exporter, channel)
    finally:
        await exporter.stop()
        await prefill.stop()
        await decode.stop()


def prompt(num_tokens: int, offset: int = 0) -> list[int]:
    return [3 + (offset + 5 * i) % 200 for i in range(num_tokens)]


async def context_step(pair: Pair, request_id: str, token_ids: list[int], salt: str = "t") -> GenerationOutput:
    request = GenerationRequest(request_id, token_ids, SamplingParams(max_tokens=1), salt, pin_kv_on_finish=True)
    outputs = [o async for o in pair.prefill.generate(request)]
    pin = outputs[-1].kv_pin
    assert pin is not None and pin.num_tokens == len(token_ids)
    pair.exports.add(pin)
    return outputs[-1]


@dataclass
class Imported:
    tokens: list[int]
    plan: ImportPlan
    received: list[torch.Tensor]  # the pulled blocks' bytes, per layer, as they were written


async def generate_imported(pair: Pair, request_id: str, token_ids: list[int], first: GenerationOutput,
                            max_tokens: int, salt: str = "t") -> Imported:
    assert first.kv_pin is not None
    source = pair.opaque(first.kv_pin)
    plans: list[ImportPlan] = []
    received: list[torch.Tensor] = []
    decode_caches = pair.channel.layout.caches  # type: ignore[attr-defined]

    async def fill(plan: ImportPlan) -> None:
        plans.append(plan)
        await pair.channel.pull(source, plan.first_block, plan.block_ids)
        received.extend(cache[plan.block_ids].clone() for cache in decode_caches)

    request = GenerationRequest(request_id, token_ids, SamplingParams(max_tokens=max_tokens), salt)
    tokens = [t async for o in pair.decode.generate_imported(request, first.new_token_ids[0], fill) for t in o.new_token_ids]
    return Imported(tokens, plans[0], received)


async def collocated(engine: AsyncEngine, request_id: str, token_ids: list[int], max_tokens: int) -> list[int]:
    request = GenerationRequest(request_id, token_ids, SamplingParams(max_tokens=max_tokens), "collocated")
    return [t async for o in engine.generate(request) for t in o.new_token_ids]


def block_bytes(runner: ModelRunner, block_ids: list[int]) -> list[torch.Tensor]:
    return [cache[block_ids].clone() for cache in runner.kv_caches]


@pytest.mark.parametrize("num_tokens", [5, 16, 17, 47, 64])
async def test_imported_kv_is_byte_equal_and_generation_matches_collocated(
    pair: Pair, runners: tuple[ModelRunner, ModelRunner], num_tokens: int
) -> None:
    token_ids = prompt(num_tokens)
    first = await context_step(pair, f"ctx-{num_tokens}", token_ids)
    assert first.kv_pin is not None
    sent = block_bytes(runners[0], first.kv_pin.block_ids)
    imported = await generate_imported(pair, f"gen-{num_tokens}", token_ids, first, max_tokens=6)
    tokens, plan = imported.tokens, imported.plan
    assert len(imported.received) == len(runners[1].kv_caches) and plan.block_ids
    for layer_sent, layer_received in zip(sent, imported.received, strict=True):
        assert torch.equal(layer_sent[plan.first_block :], layer_received)
    assert tokens == await collocated(pair.decode, f"ref-{num_tokens}", token_ids, 6)
    assert tokens[0] == first.new_token_ids[0] and len(tokens) == 6
    await asyncio.sleep(0.05)  # the release runs on the prefill engine's thread
    for engine in (pair.prefill, pair.decode):
        stats = engine.stats()
        assert stats.num_kv_blocks_pinned == 0 and stats.num_kv_blocks_free == stats.num_kv_blocks_total
    assert len(pair.exports) == 0


async def test_the_decode_side_pulls_only_blocks_its_own_prefix_cache_lacks(pair: Pair) -> None:
    token_ids = prompt(50, offset=1)
    expected = await collocated(pair.decode, "warm", token_ids[:40] + [9] * 10, max_tokens=1)  # caches 2 blocks
    assert expected
    first = await context_step(pair, "ctx-hit", token_ids, salt="collocated")
    imported = await generate_imported(pair, "gen-hit", token_ids, first, max_tokens=4, salt="collocated")
    tokens, plan = imported.tokens, imported.plan
    assert plan.num_cached_tokens == 32 and plan.first_block == 2 and len(plan.block_ids) == 2
    assert tokens == await collocated(pair.decode, "ref-hit", token_ids, 4)


async def test_an_expired_pin_is_a_clear_error_and_nothing_leaks(pair: Pair) -> None:
    token_ids = prompt(40, offset=2)
    first = await context_step(pair, "ctx-exp", token_ids)
    assert await pair.exports.expire(now=float("inf")) == 1 and pair.exports.num_expired == 1
    with pytest.raises(PinNotFound, match="expired"):
        await generate_imported(pair, "gen-exp", token_ids, first, max_tokens=3)
    await asyncio.sleep(0.05)
    for engine in (pair.prefill, pair.decode):
        stats = engine.stats()
        assert stats.num_kv_blocks_pinned == 0 and stats.num_kv_blocks_free == stats.num_kv_blocks_total


async def test_a_foreign_fingerprint_or_secret_is_refused_before_any_byte(
    pair: Pair, runners: tuple[ModelRunner, ModelRunner]
) -> None:
    token_ids = prompt(33, offset=3)
    first = await context_step(pair, "ctx-bad", token_ids)
    assert first.kv_pin is not None
    source = pair.opaque(first.kv_pin)
    target = [60, 61, 62]
    before = block_bytes(runners[1], target)
    other = KVLayout(runners[1].kv_caches, "another-model")
    with pytest.raises(FingerprintMismatch):
        await TcpChannel(other, SECRET).pull(source, 0, target)
    with pytest.raises(TransferRefused, match="API key"):
        await TcpChannel(KVLayout.of(runners[1].kv_caches, pair.decode.model_name), b"wrong").pull(source, 0, target)
    after = block_bytes(runners[1], target)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    imported = await generate_imported(pair, "gen-after-refusals", token_ids, first, max_tokens=2)  # still pullable
    assert len(imported.tokens) == 2
