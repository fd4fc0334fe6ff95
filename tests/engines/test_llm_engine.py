"""LLMEngine with the real SmolLM2 model (`smollm2_fast_runner`, loaded once per session).

Greedy outputs are compared between runs that differ only in what the engine does around the
model (prefix cache, batching, preemption): they must produce exactly the same tokens.
"""

from __future__ import annotations

import pytest

from engines.base import GenerationOutput, GenerationRequest
from engines.builtin.config import EngineConfig
from engines.builtin.engine.llm_engine import LLMEngine
from engines.builtin.runner.model_runner import ModelRunner
from engines.errors import EngineOverloaded, InvalidRequest
from engines.sampling_params import SamplingParams

BLOCK_SIZE = 16


def make_engine(runner: ModelRunner, num_kv_blocks: int = 256, **overrides: object) -> LLMEngine:
    config = EngineConfig(block_size=BLOCK_SIZE, num_kv_blocks=num_kv_blocks, **overrides)
    return LLMEngine(config, runner)


def chat(runner: ModelRunner, text: str) -> list[int]:
    tok = runner.tokenizer
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]))


def run(engine: LLMEngine, *requests: GenerationRequest) -> dict[str, list[GenerationOutput]]:
    for request in requests:
        engine.add_request(request)
    outputs: dict[str, list[GenerationOutput]] = {r.request_id: [] for r in requests}
    while engine.has_unfinished:
        for output in engine.step():
            outputs[output.request_id].append(output)
    return outputs


def tokens_of(outputs: list[GenerationOutput]) -> list[int]:
    return [t for o in outputs for t in o.new_token_ids]


def greedy(request_id: str, prompt: list[int], max_tokens: int = 12, salt: str | None = None, **kw: object) -> GenerationRequest:
    return GenerationRequest(request_id, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True, **kw), salt)


def assert_no_leak(engine: LLMEngine) -> None:
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    assert all(b.ref_count == 0 for b in engine.block_manager.blocks)
    assert not engine.scheduler.running and not engine.scheduler.waiting


PROMPT = "Explain in two sentences why the sky is blue, and mention Rayleigh scattering."


def test_prefix_cache_hit_yields_the_same_tokens_as_cold(smollm2_fast_runner: ModelRunner) -> None:
    engine = make_engine(smollm2_fast_runner)
    prompt = chat(smollm2_fast_runner, PROMPT)
    assert len(prompt) > 2 * BLOCK_SIZE
    cold = run(engine, greedy("cold", prompt, salt="t1"))["cold"]
    warm = run(engine, greedy("warm", prompt, salt="t1"))["warm"]
    assert cold[-1].num_cached_tokens == 0
    cached = warm[-1].num_cached_tokens
    assert cached > 0 and cached % BLOCK_SIZE == 0 and cached < len(prompt)
    assert tokens_of(warm) == tokens_of(cold)
    assert "".join(o.new_text for o in warm) == "".join(o.new_text for o in cold)
    other = run(engine, greedy("other", prompt, salt="t2"))["other"]
    assert other[-1].num_cached_tokens == 0  # another tenant never hits
    assert tokens_of(other) == tokens_of(cold)
    stats = engine.stats()
    assert stats.num_prefix_hit_tokens == cached and stats.num_prompt_tokens == 3 * len(prompt)
    assert stats.num_generated_tokens == 36
    assert_no_leak(engine)


def test_kv_events_and_lru_eviction(smollm2_fast_runner: ModelRunner) -> None:
    tok = smollm2_fast_runner.tokenizer
    first = tok.encode("The history of the printing press begins in Mainz, where Johannes Gutenberg combined "
                       "movable metal type, oil-based ink and a wooden press around the year 1440.")
    second = tok.encode("Volcanoes form where magma from the mantle reaches the surface, often along the edges "
                        "of tectonic plates or above hot spots such as the one under Hawaii today.")
    num_blocks = -(-(len(first) + 8) // BLOCK_SIZE)
    num_stored = (len(first) + 7) // BLOCK_SIZE  # full blocks whose KV gets computed
    # Just enough blocks for the first request: the second can only run by evicting its cache.
    engine = make_engine(smollm2_fast_runner, num_kv_blocks=num_blocks)
    assert -(-len(second) // BLOCK_SIZE) > num_blocks - num_stored
    assert -(-(len(second) + 8) // BLOCK_SIZE) <= num_blocks
    run(engine, greedy("a", first, max_tokens=8))
    events = engine.drain_kv_events()
    stored = [h for e in events if e.kind == "stored" for h in e.block_hashes]
    assert len(stored) == num_stored
    assert len(engine.block_manager.hash_to_block) == num_stored
    assert engine.stats().num_kv_blocks_free == num_blocks  # cached but unreferenced counts as free
    run(engine, greedy("b", second, max_tokens=8))
    removed = [h for e in engine.drain_kv_events() if e.kind == "removed" for h in e.block_hashes]
    assert removed and set(removed) <= set(stored)
    again = run(engine, greedy("c", first, max_tokens=8))["c"]
    assert again[-1].num_cached_tokens < (len(first) - 1) // BLOCK_SIZE * BLOCK_SIZE  # evicted: not all hit
    assert_no_leak(engine)


def test_preemption_under_kv_pressure_keeps_outputs_exact(smollm2_fast_runner: ModelRunner) -> None:
    texts = ["Name three fruits.", "What is 2 + 2?", "Say hello in French.", "Describe a cat briefly."]
    prompts = [chat(smollm2_fast_runner, t) for t in texts]
    alone_engine = make_engine(smollm2_fast_runner)
    alone = {f"r{i}": tokens_of(run(alone_engine, greedy(f"r{i}", p, max_tokens=16))[f"r{i}"]) for i, p in enumerate(prompts)}
    # Each request ends with ~3 blocks; 4 requests need ~12 but only 7 exist.
    tight = make_engine(smollm2_fast_runner, num_kv_blocks=7, max_num_seqs=4, max_num_batched_tokens=64)
    for i, p in enumerate(prompts):
        tight.add_request(greedy(f"r{i}", p, max_tokens=16))
    together: dict[str, list[GenerationOutput]] = {f"r{i}": [] for i in range(len(prompts))}
    for _ in range(3):
        for output in tight.step():
            together[output.request_id].append(output)
    # A request that could never fit in 7 blocks is refused up front; the others carry on.
    with pytest.raises(EngineOverloaded, match="KV blocks"):
        tight.add_request(greedy("huge", prompts[0], max_tokens=200))
    while tight.has_unfinished:
        for output in tight.step():
            together[output.request_id].append(output)
    assert tight.stats().num_preemptions > 0
    assert {k: tokens_of(v) for k, v in together.items()} == alone
    assert all(v[-1].finish_reason == "length" for v in together.values())
    assert_no_leak(tight)


def test_stop_string_spanning_tokens_and_eos(smollm2_fast_runner: ModelRunner) -> None:
    engine = make_engine(smollm2_fast_runner)
    prompt = chat(smollm2_fast_runner, "Reply with one short sentence about the moon.")
    full = run(engine, greedy("full", prompt, max_tokens=24))["full"]
    text = "".join(o.new_text for o in full)
    pieces = [o.new_text for o in full]
    i = next(i for i in range(1, len(pieces) - 1) if len(pieces[i]) >= 2 and len(pieces[i + 1]) >= 2)
    stop = pieces[i][-2:] + pieces[i + 1][:2]  # spans a token boundary
    stopped = run(engine, greedy("stopped", prompt, max_tokens=24, stop=[stop]))["stopped"]
    assert stopped[-1].finish_reason == "stop"
    assert "".join(o.new_text for o in stopped) == text[: text.find(stop)]
    # Without ignore_eos the model ends its short answer itself, and the EOS text is not emitted.
    natural = run(engine, GenerationRequest("eos", prompt, SamplingParams(max_tokens=64)))["eos"]
    assert natural[-1].finish_reason == "stop"
    assert natural[-1].new_token_ids[-1] in smollm2_fast_runner.tokenizer.eos_token_ids
    assert "<|im_end|>" not in "".join(o.new_text for o in natural)
    assert_no_leak(engine)


def test_bad_requests_get_clear_errors(smollm2_fast_runner: ModelRunner) -> None:
    engine = make_engine(smollm2_fast_runner, max_model_len=64)
    with pytest.raises(InvalidRequest, match="empty"):
        engine.add_request(greedy("a", []))
    with pytest.raises(InvalidRequest, match="context"):
        engine.add_request(greedy("b", [1] * 80))
    with pytest.raises(InvalidRequest, match="max_tokens"):
        engine.add_request(greedy("c", [1] * 60, max_tokens=10))
    with pytest.raises(InvalidRequest, match="vocabulary"):
        engine.add_request(greedy("d", [1, 49152]))
    with pytest.raises(InvalidRequest, match="vocabulary"):
        engine.add_request(greedy("e", [-1]))
    with pytest.raises(InvalidRequest, match="max_tokens"):
        SamplingParams(max_tokens=0)
    with pytest.raises(InvalidRequest, match="temperature"):
        SamplingParams(temperature=7.0)
    with pytest.raises(InvalidRequest, match="top_p"):
        SamplingParams(top_p=0.0)
    engine.add_request(greedy("ok", [1, 2, 3], max_tokens=2))
    with pytest.raises(InvalidRequest, match="already in use"):
        engine.add_request(greedy("ok", [1, 2, 3], max_tokens=2))
    assert engine.abort("ok").finish_reason == "abort"
    assert engine.abort("nobody") is None
    assert_no_leak(engine)


def test_waiting_queue_is_bounded(smollm2_fast_runner: ModelRunner) -> None:
    engine = make_engine(smollm2_fast_runner, max_waiting=2)
    engine.add_request(greedy("a", [1, 2]))
    engine.add_request(greedy("b", [1, 2]))
    with pytest.raises(EngineOverloaded, match="waiting"):
        engine.add_request(greedy("c", [1, 2]))
    engine.abort("a")
    engine.abort("b")


def test_seeded_sampling_is_reproducible_in_any_batch(smollm2_fast_runner: ModelRunner) -> None:
    engine = make_engine(smollm2_fast_runner)
    prompt = chat(smollm2_fast_runner, "Tell me a fun fact.")

    def sampled(request_id: str) -> GenerationRequest:
        return GenerationRequest(request_id, prompt, SamplingParams(max_tokens=10, temperature=1.0, seed=1234, ignore_eos=True))

    alone = tokens_of(run(engine, sampled("s1"))["s1"])
    crowd = run(engine, greedy("g", chat(smollm2_fast_runner, "Count to five."), max_tokens=10), sampled("s2"))
    assert tokens_of(crowd["s2"]) == alone
