"""Per-row LoRA in the built-in engine (runner/lora.py, engine/adapters.py), on the seeded random tiny Llama
in deterministic mode: an adapter's greedy output equals the base model with the adapter merged into a copy
of its weights, rows without an adapter are bit for bit what they are alone, and the prefix cache never
hands one adapter's blocks to another."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engines.base import GenerationRequest
from engines.builtin.config import EngineConfig
from engines.builtin.engine.llm_engine import LLMEngine
from engines.builtin.runner.model_runner import ForwardItem, ModelRunner
from engines.errors import AdapterNotFound, EngineOverloaded, InvalidRequest
from engines.sampling_params import SamplingParams
from tests.engines.lora_files import ALL_MODULES, merged_weights, write_adapter

PROMPT = [5, 17, 99, 3, 250, 41, 7, 8, 120, 66, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 200, 201]


def tiny_config(lora_dir: Path | None = None, **kw: object) -> EngineConfig:
    return EngineConfig(model="random:tiny", num_kv_blocks=128, weight_dtype="float32", mode="deterministic",
                        lora_dir=lora_dir, step_workers=1, **kw)  # type: ignore[arg-type]


def greedy(request_id: str, prompt: list[int], lora: str | None = None, max_tokens: int = 16,
           salt: str | None = None) -> GenerationRequest:
    return GenerationRequest(request_id, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True), salt, lora=lora)


def run(engine: LLMEngine, *requests: GenerationRequest) -> dict[str, list[int]]:
    for request in requests:
        engine.add_request(request)
    tokens: dict[str, list[int]] = {r.request_id: [] for r in requests}
    cached: dict[str, int] = {}
    while engine.has_unfinished:
        for output in engine.step():
            tokens[output.request_id] += output.new_token_ids
            cached[output.request_id] = output.num_cached_tokens
    engine.last_cached = cached  # type: ignore[attr-defined]
    return tokens


@pytest.mark.parametrize(("rank", "targets"), [
    (1, ("q_proj",)),
    (8, ("q_proj", "v_proj")),
    (16, ("k_proj", "o_proj", "down_proj")),
    (32, ALL_MODULES),
])
def test_adapter_output_equals_the_merged_model(tmp_path: Path, rank: int, targets: tuple[str, ...]) -> None:
    runner = ModelRunner(tiny_config())
    write_adapter(tmp_path / "a", runner.model_config, rank, targets, seed=rank, std=0.5)
    engine = LLMEngine(tiny_config(tmp_path), runner)
    with_adapter = run(engine, greedy("a", PROMPT, "a"))["a"]
    merged_runner = ModelRunner(tiny_config())
    merged_runner.weights = merged_weights(merged_runner.weights, merged_runner.model_config, tmp_path / "a")
    assert run(LLMEngine(tiny_config(), merged_runner), greedy("m", PROMPT))["m"] == with_adapter
    # the adapter changes the model (else the comparison would say nothing): its logits differ from the base's
    slot = engine.adapters.acquire("a")
    adapted = runner.execute([ForwardItem(PROMPT, 0, [0, 1], lora_slot=slot)])
    base = runner.execute([ForwardItem(PROMPT, 0, [0, 1])])
    assert (adapted - base).abs().max() > 1e-2
    torch.testing.assert_close(adapted, merged_runner.execute([ForwardItem(PROMPT, 0, [0, 1])]), rtol=1e-5, atol=1e-5)


def test_logits_match_the_merged_model_in_a_mixed_batch(tmp_path: Path) -> None:
    runner = ModelRunner(tiny_config())
    write_adapter(tmp_path / "x", runner.model_config, 8, ALL_MODULES, seed=1)
    engine = LLMEngine(tiny_config(tmp_path), runner)
    slot = engine.adapters.acquire("x")
    # a prefill chunk and a decode row under the adapter, next to base rows, in one step
    items = [ForwardItem(PROMPT[:9], 0, [0], lora_slot=slot), ForwardItem(PROMPT[:9], 0, [1]),
             ForwardItem([PROMPT[0]], 0, [2], lora_slot=slot), ForwardItem([PROMPT[0]], 0, [3])]
    mixed = runner.execute(items)
    merged = ModelRunner(tiny_config())
    merged.weights = merged_weights(merged.weights, merged.model_config, tmp_path / "x")
    reference = merged.execute([ForwardItem(PROMPT[:9], 0, [0]), ForwardItem([PROMPT[0]], 0, [2])])
    torch.testing.assert_close(mixed[[0, 2]], reference, rtol=1e-5, atol=1e-5)
    # the same step with no adapter anywhere: the base rows are bit for bit the same
    plain = runner.execute([ForwardItem(item.token_ids, 0, item.block_table) for item in items])
    assert torch.equal(mixed[[1, 3]], plain[[1, 3]]), "rows without an adapter must not see their neighbours'"


def test_rows_without_adapter_are_unchanged_by_neighbours_adapters(tmp_path: Path) -> None:
    runner = ModelRunner(tiny_config())
    for i, name in enumerate(("a", "b", "c")):
        write_adapter(tmp_path / name, runner.model_config, 4 * (i + 1), ALL_MODULES[i:i + 3], seed=10 + i)
    engine = LLMEngine(tiny_config(tmp_path), runner)
    prompts = {f"r{i}": PROMPT[i:] + PROMPT[:i] for i in range(6)}
    alone = {rid: run(engine, greedy(rid, p))[rid] for rid, p in prompts.items() if rid in ("r0", "r3")}
    adapters = {"r1": "a", "r2": "b", "r4": "c", "r5": "a"}
    together = run(engine, *(greedy(rid, p, adapters.get(rid)) for rid, p in prompts.items()))
    assert together["r0"] == alone["r0"] and together["r3"] == alone["r3"]
    solo_b = run(engine, greedy("solo", prompts["r2"], "b"))["solo"]
    assert together["r2"] == solo_b, "an adapter's rows are the same alone and batched with other adapters"
    assert engine.adapters.refs == [0] * runner.lora_slots.num_slots


def test_prefix_cache_is_never_shared_across_adapters(tmp_path: Path) -> None:
    runner = ModelRunner(tiny_config())
    write_adapter(tmp_path / "x", runner.model_config, 8, seed=1)
    write_adapter(tmp_path / "y", runner.model_config, 8, seed=2)
    engine = LLMEngine(tiny_config(tmp_path), runner)
    cold_x = run(engine, greedy("x1", PROMPT, "x", max_tokens=4))["x1"]
    assert engine.last_cached["x1"] == 0  # type: ignore[attr-defined]
    for name, lora in (("y", "y"), ("base", None)):
        run(engine, greedy(name, PROMPT, lora, max_tokens=4))
        assert engine.last_cached[name] == 0, f"{name} was served adapter x's prefix"  # type: ignore[attr-defined]
    assert run(engine, greedy("x2", PROMPT, "x", max_tokens=4))["x2"] == cold_x
    assert engine.last_cached["x2"] == 16, "the same adapter does reuse its own prefix"  # type: ignore[attr-defined]


def two_slot_engine(tmp_path: Path, names: str) -> LLMEngine:
    """An engine of 2 adapter slots over rank-4 adapters `names` (one letter each) in `tmp_path`."""
    runner = ModelRunner(tiny_config(max_loras=2))
    for name in names:
        write_adapter(tmp_path / name, runner.model_config, 4, seed=ord(name))
    return LLMEngine(tiny_config(tmp_path, max_loras=2), runner)


def test_least_recently_used_adapter_is_unloaded_and_busy_slots_refuse(tmp_path: Path) -> None:
    engine = two_slot_engine(tmp_path, "abc")
    solo_a = run(engine, greedy("a0", PROMPT, "a"))["a0"]
    run(engine, greedy("b0", PROMPT, "b"))
    run(engine, greedy("c0", PROMPT, "c"))  # evicts a, the least recently used
    assert engine.adapters.names == ["c", "b"]
    assert run(engine, greedy("a1", PROMPT, "a"))["a1"] == solo_a  # reloaded into b's slot
    assert engine.adapters.names == ["a", "c"] and engine.stats().resident_adapters == ("a", "c")
    engine.add_request(greedy("hold-a", PROMPT, "a"))
    engine.add_request(greedy("hold-c", PROMPT, "c"))
    with pytest.raises(EngineOverloaded, match="adapter slots"):
        engine.add_request(greedy("b1", PROMPT, "b"))


def test_an_unloaded_adapter_keeps_its_slot_for_running_requests_only(tmp_path: Path) -> None:
    engine = two_slot_engine(tmp_path, "ab")
    solo_a = run(engine, greedy("a0", PROMPT, "a"))["a0"]
    engine.add_request(greedy("running", PROMPT, "a", max_tokens=4))
    engine.step()  # prefilled under a, which is now deleted
    assert engine.adapters.unload("a") and not engine.adapters.unload("a")
    assert engine.adapters.names == [] and engine.stats().resident_adapters == ()
    engine.add_request(greedy("b0", PROMPT, "b"))  # the free slot, not the one a's running request holds
    with pytest.raises(EngineOverloaded, match="adapter slots"):
        engine.add_request(greedy("a1", PROMPT, "a"))  # both slots held: a reload waits for running to end
    while engine.has_unfinished:
        engine.step()
    assert engine.adapters.refs == [0, 0]
    num_loads = engine.adapters.num_loads
    assert run(engine, greedy("a2", PROMPT, "a"))["a2"] == solo_a  # read from lora_dir again
    assert engine.adapters.num_loads == num_loads + 1


def test_unknown_or_bad_adapters_are_refused(tmp_path: Path) -> None:
    runner = ModelRunner(tiny_config())
    write_adapter(tmp_path / "big", runner.model_config, 16, seed=1)
    engine = LLMEngine(tiny_config(tmp_path, max_lora_rank=8), runner)
    with pytest.raises(AdapterNotFound, match="upload it first"):
        engine.add_request(greedy("u", PROMPT, "nope"))
    with pytest.raises(AdapterNotFound):
        engine.add_request(greedy("t", PROMPT, "../big"))
    with pytest.raises(InvalidRequest, match="rank"):
        engine.add_request(greedy("r", PROMPT, "big"))
    with pytest.raises(AdapterNotFound, match="no lora_dir"):
        LLMEngine(tiny_config(), runner).add_request(greedy("n", PROMPT, "big"))
