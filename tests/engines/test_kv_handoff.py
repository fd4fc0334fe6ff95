"""The engine's side of disaggregated serving, step by step: pinning a context step's blocks,
importing a prompt's KV into reserved blocks, and aborting an import midway."""

from __future__ import annotations

import json

import pytest

from engines.base import GenerationRequest
from engines.builtin.config import EngineConfig
from engines.builtin.engine.kv_handoff import finish_import, reserve_import
from engines.builtin.engine.llm_engine import LLMEngine
from engines.builtin.engine.sequence import SequenceStatus
from engines.builtin.runner.model_runner import ModelRunner
from engines.errors import InvalidRequest
from engines.guided import Guide
from engines.sampling_params import SamplingParams

CONFIG = EngineConfig(model="random:tiny", num_kv_blocks=32, weight_dtype="float32")


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    return LLMEngine(CONFIG, ModelRunner(CONFIG))


def run(engine: LLMEngine) -> list:
    outputs = []
    while engine.has_unfinished:
        outputs += engine.step()
    return outputs


def test_a_context_step_pins_its_prompt_blocks_until_released(engine: LLMEngine) -> None:
    prompt = list(range(3, 3 + 40))  # 3 blocks of 16, the last partial
    engine.add_request(GenerationRequest("ctx", prompt, SamplingParams(max_tokens=1), "t", pin_kv_on_finish=True))
    [final] = run(engine)
    pin = final.kv_pin
    assert final.finish_reason == "length" and pin is not None
    assert pin.num_tokens == 40 and len(pin.block_ids) == 3
    assert engine.stats().num_kv_blocks_pinned == 3 and engine.stats().num_kv_blocks_free == 32 - 3
    assert engine.pins.release(pin.pin_id) and not engine.pins.release(pin.pin_id)
    assert engine.stats().num_kv_blocks_free == 32 and engine.stats().num_kv_blocks_pinned == 0


def test_a_context_step_that_stops_on_its_own_pins_nothing(engine: LLMEngine) -> None:
    request = GenerationRequest("ctx-abort", list(range(3, 30)), SamplingParams(max_tokens=1), "t", pin_kv_on_finish=True)
    engine.add_request(request)
    assert engine.abort("ctx-abort").kv_pin is None  # type: ignore[union-attr]
    assert engine.stats().num_kv_blocks_pinned == 0 and engine.stats().num_kv_blocks_free == 32


def test_an_import_reserves_past_its_own_hits_and_continues_from_the_first_token(engine: LLMEngine) -> None:
    prompt = list(range(50, 50 + 37))
    engine.add_request(GenerationRequest("warm", prompt[:33], SamplingParams(max_tokens=1), "s"))
    run(engine)  # caches the first 2 full blocks under salt "s"
    plan = reserve_import(engine, GenerationRequest("imp", prompt, SamplingParams(max_tokens=3), "s"))
    assert (plan.first_block, len(plan.block_ids), plan.num_cached_tokens) == (2, 1, 32)
    assert engine.seqs["imp"].status is SequenceStatus.IMPORTING and not engine.scheduler.running
    first = finish_import(engine, "imp", 7)
    assert first.new_token_ids == [7] and first.num_generated_tokens == 1 and first.num_cached_tokens == 32
    outputs = run(engine)
    assert outputs[-1].finish_reason == "length" and outputs[-1].num_generated_tokens == 3
    assert engine.stats().num_kv_blocks_free == 32


def test_an_aborted_import_frees_its_blocks_and_cannot_be_finished(engine: LLMEngine) -> None:
    plan = reserve_import(engine, GenerationRequest("gone", list(range(100, 150)), SamplingParams(max_tokens=4), "u"))
    assert len(plan.block_ids) == 4 and engine.stats().num_kv_blocks_free == 32 - 4
    engine.abort("gone")
    assert engine.stats().num_kv_blocks_free == 32
    with pytest.raises(InvalidRequest, match="not waiting for imported KV"):
        finish_import(engine, "gone", 5)


def test_imported_requests_wait_for_a_running_slot_under_max_num_seqs() -> None:
    config = EngineConfig(model="random:tiny", num_kv_blocks=32, weight_dtype="float32", max_num_seqs=2)
    engine = LLMEngine(config, ModelRunner(config))
    engine.add_request(GenerationRequest("local", list(range(200, 210)), SamplingParams(max_tokens=6), "v"))
    engine.step()  # one running request of its own
    for i in range(3):
        reserve_import(engine, GenerationRequest(f"imp{i}", list(range(300 + 20 * i, 317 + 20 * i)),
                                                 SamplingParams(max_tokens=3), "v"))
        first = finish_import(engine, f"imp{i}", 9)
        assert first.new_token_ids == [9] and not first.is_finished
    assert len(engine.scheduler.running) == 1 and engine.stats().num_waiting == 3
    finished: dict[str, str | None] = {}
    while engine.has_unfinished:
        outputs = engine.step()
        assert len(engine.scheduler.running) <= 2  # the imports never push the batch past max_num_seqs
        finished |= {o.request_id: o.finish_reason for o in outputs if o.is_finished}
    assert finished == {"local": "length", "imp0": "length", "imp1": "length", "imp2": "length"}
    assert engine.stats().num_kv_blocks_free == 32


def test_an_imported_request_aborted_while_it_waits_for_a_slot_frees_its_blocks() -> None:
    config = EngineConfig(model="random:tiny", num_kv_blocks=32, weight_dtype="float32", max_num_seqs=1)
    engine = LLMEngine(config, ModelRunner(config))
    engine.add_request(GenerationRequest("busy", list(range(200, 210)), SamplingParams(max_tokens=4), "w"))
    engine.step()
    reserve_import(engine, GenerationRequest("queued", list(range(400, 440)), SamplingParams(max_tokens=4), "w"))
    finish_import(engine, "queued", 9)
    assert engine.seqs["queued"].status is SequenceStatus.IMPORTED
    engine.abort("queued")
    run(engine)
    assert engine.stats().num_kv_blocks_free == 32 and not engine.scheduler.imported


def test_a_guided_request_keeps_its_grammar_across_the_handoff(engine: LLMEngine) -> None:
    schema = {"type": "object", "properties": {"c": {"enum": ["red", "blue"]}}, "required": ["c"]}
    guided = SamplingParams(max_tokens=1, temperature=1.0, seed=5, guide=Guide.json_schema(schema))
    prompt = list(range(200, 230))
    engine.add_request(GenerationRequest("g-ctx", prompt, guided, "g", pin_kv_on_finish=True))
    [context] = run(engine)
    assert context.kv_pin is not None and engine.pins.release(context.kv_pin.pin_id)
    first_token = context.new_token_ids[0]
    decode = SamplingParams(max_tokens=24, temperature=1.0, seed=5, guide=Guide.json_schema(schema))
    reserve_import(engine, GenerationRequest("g-imp", prompt, decode, "g"))
    first = finish_import(engine, "g-imp", first_token)  # the grammar consumes the context step's token
    text = first.new_text + "".join(o.new_text for o in run(engine))
    assert json.loads(text)["c"] in ("red", "blue")
    assert engine.stats().num_kv_blocks_free == 32
