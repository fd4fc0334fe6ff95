"""An EAGLE-3 head in the real engine: whatever a random head drafts, greedy output is the target's."""


from engines.base import GenerationRequest
from engines.builtin.config import EngineConfig
from engines.builtin.engine.llm_engine import LLMEngine
from engines.builtin.runner.model_runner import ModelRunner
from engines.builtin.speculative.factory import build_proposer
from engines.sampling_params import SamplingParams
from tests.engines.eagle3.conftest import random_head_for
from training.eagle3.export import save_head

PROMPTS = {"a": list(range(3, 40)), "b": list(range(50, 70)) * 2, "c": [7, 8, 9, 10] * 5}


def generate(engine: LLMEngine) -> dict[str, list[int]]:
    for request_id, prompt in PROMPTS.items():
        engine.add_request(GenerationRequest(request_id, prompt, SamplingParams(max_tokens=16, ignore_eos=True)))
    out: dict[str, list[int]] = {key: [] for key in PROMPTS}
    while engine.has_unfinished:
        for o in engine.step():
            out[o.request_id].extend(o.new_token_ids)
    return out


def test_random_head_through_the_factory_keeps_greedy_output(tmp_path):
    base = EngineConfig(model="random:tiny", num_kv_blocks=64, weight_dtype="float32")
    runner = ModelRunner(base)
    head = random_head_for(runner)
    save_head(head, tmp_path)
    expected = generate(LLMEngine(base, runner))
    config = EngineConfig(model="random:tiny", num_kv_blocks=64, weight_dtype="float32", speculative="eagle3",
                          speculative_model=str(tmp_path), num_speculative_tokens=3,
                          speculative_max_concurrency=4)  # all three run at once
    proposer = build_proposer(config, runner)
    engine = LLMEngine(config, runner, proposer=proposer)
    assert generate(engine) == expected
    assert engine.speculator.num_draft_tokens > 0  # the head did draft, and was verified
    assert proposer.caches == {}  # every finished sequence was forgotten
