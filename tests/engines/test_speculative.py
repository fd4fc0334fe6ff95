"""Speculative decoding in the engine, with the real SmolLM2 in exact weight mode (`smollm2_runner`).

Whatever the proposer drafts, greedy output must be token for token the output of the same engine
without speculation: with n-gram lookup, with an oracle that always drafts the right tokens, with
one that always drafts wrong ones, in mixed batches, with prefix-cache hits and under preemption.
The rejection sampler itself is tested statistically in test_rejection.py.
"""

from __future__ import annotations

import pytest

from contracts.prefix_hash import chain_hashes
from engines.base import GenerationOutput, GenerationRequest
from engines.builtin.config import EngineConfig
from engines.builtin.engine.llm_engine import LLMEngine
from engines.builtin.runner.model_runner import ModelRunner
from engines.builtin.speculative.draft_policy import StepCosts
from engines.builtin.speculative.proposer import DraftInput
from engines.builtin.speculative.speculator import PRIOR_VERIFY_COST
from engines.sampling_params import SamplingParams

BLOCK_SIZE = 16
JSON_TASK = (
    'Copy this JSON exactly, changing only "city" to "Paris": '
    '{"name": "Ada Lovelace", "city": "London", "born": 1815, "fields": ["mathematics", "computing"]}'
)
TEXTS = [JSON_TASK, "Name three fruits.", "What is 2 + 2?", "Say hello in French."]
MAX_TOKENS = {"r0": 24, "r1": 12, "r2": 12, "r3": 12}  # the JSON copy needs a few more to show copying


class ScriptedProposer:
    """Drafts from known outputs: right ones (`shift=0`) or always wrong ones (`shift=1`).

    `skip` names requests it never drafts for, so a batch mixes verify rows and plain decodes.
    """

    aux_layers: tuple[int, ...] = ()

    def __init__(self, outputs: dict[str, list[int]], shift: int, skip: tuple[str, ...] = ()) -> None:
        self.full = outputs
        self.shift = shift
        self.skip = skip
        self.finished: list[str] = []

    def propose(self, inputs: list[DraftInput]) -> list[list[int]]:
        drafts = []
        for i in inputs:
            known = self.full.get(i.seq_id, [])
            ahead = known[len(i.token_ids) : len(i.token_ids) + i.num_drafts] if i.seq_id not in self.skip else []
            drafts.append([(t + self.shift) % 49152 for t in ahead])
        return drafts

    def finish(self, seq_id: str) -> None:
        self.finished.append(seq_id)


def make_engine(runner: ModelRunner, proposer: object = None, num_kv_blocks: int = 256, **overrides: object) -> LLMEngine:
    # speculating in batches of up to 4 (the default, 1, would leave batches without verify rows), a
    # fixed draft length of 3 (adaptive drafting would soon stop verifying wrong drafts: tested apart)
    overrides = {"speculative_max_concurrency": 4, "speculative_adaptive": False, "num_speculative_tokens": 3, **overrides}
    config = EngineConfig(block_size=BLOCK_SIZE, num_kv_blocks=num_kv_blocks, weight_dtype="float32", **overrides)
    return LLMEngine(config, runner, proposer=proposer)


def chat(runner: ModelRunner, text: str) -> list[int]:
    tok = runner.tokenizer
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]))


def greedy(request_id: str, prompt: list[int], max_tokens: int, salt: str | None = None, **kw: object) -> GenerationRequest:
    return GenerationRequest(request_id, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True, **kw), salt)


def run(engine: LLMEngine, *requests: GenerationRequest, check=None) -> dict[str, list[GenerationOutput]]:
    for request in requests:
        engine.add_request(request)
    outputs: dict[str, list[GenerationOutput]] = {r.request_id: [] for r in requests}
    while engine.has_unfinished:
        for output in engine.step():
            outputs.setdefault(output.request_id, []).append(output)
        if check is not None:
            check(engine)
    return outputs


def tokens_of(outputs: list[GenerationOutput]) -> list[int]:
    return [t for o in outputs for t in o.new_token_ids]


def assert_no_leak(engine: LLMEngine) -> None:
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    assert all(b.ref_count == 0 for b in engine.block_manager.blocks)
    assert not engine.scheduler.running and not engine.scheduler.waiting


def blocks_fit_tokens(engine: LLMEngine) -> None:
    """After every step a running sequence holds blocks for its tokens only: rejected drafts' freed."""
    for seq in engine.scheduler.running:
        num_blocks_for = engine.block_manager.num_blocks_for
        assert num_blocks_for(seq.num_computed_tokens) <= len(seq.block_table) <= num_blocks_for(len(seq)), seq.request_id


@pytest.fixture(scope="module")
def reference(smollm2_runner: ModelRunner) -> dict[str, tuple[list[int], list[int]]]:
    """Prompt and greedy output of each text, without speculation, batched."""
    engine = make_engine(smollm2_runner)
    prompts = {f"r{i}": chat(smollm2_runner, text) for i, text in enumerate(TEXTS)}
    outputs = run(engine, *(greedy(k, p, MAX_TOKENS[k]) for k, p in prompts.items()))
    out = {k: (p, tokens_of(outputs[k])) for k, p in prompts.items()}
    assert_no_leak(engine)
    return out


def full_outputs(reference: dict[str, tuple[list[int], list[int]]]) -> dict[str, list[int]]:
    return {k: prompt + output for k, (prompt, output) in reference.items()}


def test_ngram_greedy_is_token_identical_and_accepts_copies(smollm2_runner: ModelRunner, reference) -> None:
    engine = make_engine(smollm2_runner, speculative="ngram", num_speculative_tokens=4)
    prompt, expected = reference["r0"]
    outputs = run(engine, greedy("r0", prompt, 24), check=blocks_fit_tokens)["r0"]
    assert tokens_of(outputs) == expected
    last = outputs[-1]
    assert last.num_verify_steps > 0 and last.num_accepted_draft_tokens > 0  # the JSON copies its prompt
    assert len(outputs) < len(expected)  # some steps emitted several tokens
    stats = engine.stats()
    assert stats.num_accepted_draft_tokens == last.num_accepted_draft_tokens <= stats.num_draft_tokens
    assert_no_leak(engine)


@pytest.mark.parametrize("shift", [0, 1], ids=["always-right", "always-wrong"])
def test_scripted_drafts_in_a_mixed_batch_with_a_prefill_chunk(smollm2_runner: ModelRunner, reference, shift: int) -> None:
    proposer = ScriptedProposer(full_outputs(reference), shift, skip=("r2",))
    # a small token budget: r3's prompt is prefilled in chunks while the others verify drafts
    engine = make_engine(smollm2_runner, proposer, max_num_batched_tokens=24, max_num_seqs=4)
    first: dict[str, list[GenerationOutput]] = {}
    for k in ("r0", "r1", "r2"):
        engine.add_request(greedy(k, reference[k][0], MAX_TOKENS[k]))
    for _ in range(3):
        for output in engine.step():  # r0..r2 are decoding after these
            first.setdefault(output.request_id, []).append(output)
    outputs = run(engine, greedy("r3", reference["r3"][0], 12), check=blocks_fit_tokens)
    for k, v in first.items():
        outputs[k] = v + outputs.get(k, [])
    assert {k: tokens_of(v) for k, v in outputs.items()} == {k: out for k, (_, out) in reference.items()}
    last = outputs["r3"][-1]
    assert last.num_verify_steps > 0
    if shift == 0:
        assert last.num_accepted_draft_tokens == last.num_draft_tokens  # every draft right
        assert len(outputs["r3"]) < 12
    else:
        assert last.num_accepted_draft_tokens == 0 and len(outputs["r3"]) == 12
        assert last.num_draft_tokens > 2 * last.num_verify_steps  # a fixed draft length: no backing off
    assert sorted(proposer.finished) == ["r0", "r1", "r2", "r3"]
    assert_no_leak(engine)


def test_mixed_batch_outputs_match_reference(smollm2_runner: ModelRunner, reference) -> None:
    proposer = ScriptedProposer(full_outputs(reference), 0, skip=("r1",))
    engine = make_engine(smollm2_runner, proposer, max_num_batched_tokens=32, max_num_seqs=4,
                         num_speculative_tokens=3)
    outputs = run(engine, *(greedy(k, prompt, MAX_TOKENS[k]) for k, (prompt, _) in reference.items()), check=blocks_fit_tokens)
    assert {k: tokens_of(v) for k, v in outputs.items()} == {k: out for k, (_, out) in reference.items()}
    assert outputs["r1"][-1].num_verify_steps == 0 and outputs["r0"][-1].num_verify_steps > 0
    assert_no_leak(engine)


def test_prefix_cache_hits_and_kv_events_cover_committed_tokens_only(smollm2_runner: ModelRunner, reference) -> None:
    proposer = ScriptedProposer(full_outputs(reference), 1)  # every draft rejected: junk KV slots each step
    engine = make_engine(smollm2_runner, proposer)
    prompt, expected = reference["r0"]
    cold = run(engine, greedy("r0", prompt, 24, salt="t"))["r0"]
    warm = run(engine, greedy("r0", prompt, 24, salt="t"))["r0"]
    assert tokens_of(cold) == tokens_of(warm) == expected
    assert warm[-1].num_cached_tokens > 0
    committed = set(chain_hashes(prompt + expected, BLOCK_SIZE, "t"))
    stored = {h for e in engine.drain_kv_events() if e.kind == "stored" for h in e.block_hashes}
    assert stored and stored <= committed
    assert_no_leak(engine)


def test_preemption_with_speculation_keeps_outputs_exact(smollm2_runner: ModelRunner, reference) -> None:
    # 30-token prompts fit 2 blocks and grow into a 3rd while decoding: 5 blocks cannot hold 2 of them
    prompts = {k: reference[k][0][:30] for k in ("r1", "r2", "r3")}
    plain = run(make_engine(smollm2_runner), *(greedy(k, p, 12) for k, p in prompts.items()))
    expected = {k: tokens_of(v) for k, v in plain.items()}
    proposer = ScriptedProposer({k: prompts[k] + expected[k] for k in prompts}, 0, skip=("r3",))
    engine = make_engine(smollm2_runner, proposer, num_kv_blocks=5, max_num_seqs=3, max_num_batched_tokens=64,
                         num_speculative_tokens=4)  # short drafts: sequences grow into new blocks while decoding
    outputs = run(engine, *(greedy(k, p, 12) for k, p in prompts.items()), check=blocks_fit_tokens)
    assert engine.stats().num_preemptions > 0
    assert {k: tokens_of(v) for k, v in outputs.items()} == expected
    assert outputs["r1"][-1].num_accepted_draft_tokens > 0
    assert_no_leak(engine)


def test_stop_string_inside_an_accepted_run(smollm2_runner: ModelRunner, reference) -> None:
    tok = smollm2_runner.tokenizer
    prompt, expected = reference["r0"]
    text = tok.decode(expected)
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    plain = run(make_engine(smollm2_runner), greedy("r0", prompt, 24, stop=[stop]))["r0"]
    spec = run(make_engine(smollm2_runner, ScriptedProposer(full_outputs(reference), 0)), greedy("r0", prompt, 24, stop=[stop]))["r0"]
    assert spec[-1].finish_reason == plain[-1].finish_reason == "stop"
    assert "".join(o.new_text for o in spec) == "".join(o.new_text for o in plain) == text[: text.find(stop)]
    assert tokens_of(spec) == tokens_of(plain)


class PriorCosts(StepCosts):
    """Step costs that keep their prior whatever this machine's load makes steps take: the adaptive
    drafting test is about acceptance, and a loaded CPU can measure verify rows at any cost."""

    def observe_step(self, num_tokens: int, seconds: float) -> None:
        pass

    def observe_drafts(self, num_drafts: int, seconds: float) -> None:
        pass


@pytest.mark.parametrize("shift", [0, 1], ids=["always-right", "always-wrong"])
def test_adaptive_drafting_grows_with_acceptance_and_stops_without(smollm2_runner: ModelRunner, reference, shift: int) -> None:
    engine = make_engine(smollm2_runner, ScriptedProposer(full_outputs(reference), shift), speculative_adaptive=True,
                         num_speculative_tokens=6)
    engine.speculator.policy.costs = PriorCosts(PRIOR_VERIFY_COST)
    prompt, expected = reference["r0"]
    outputs = run(engine, greedy("r0", prompt, 24))["r0"]
    assert tokens_of(outputs) == expected
    last = outputs[-1]
    if shift:  # wrong drafts: a couple of verify steps at most (none: a new sequence's first drafts wait for
        # right shadow drafts), then plain decodes with unverified shadow drafts
        assert last.num_verify_steps <= 3 and last.num_accepted_draft_tokens == 0
        assert len(outputs) == len(expected)
    else:  # right drafts: the draft length climbs to the limit (1, 1, 2, 3, 4, 6 drafts: the policy's
        # acceptance bound needs a few right drafts before it trusts long ones)
        assert last.num_accepted_draft_tokens == last.num_draft_tokens
        assert max(len(o.new_token_ids) for o in outputs) >= 6 and len(outputs) <= 8
    assert not engine.speculator.shadows and not engine.speculator.policy.sequences  # forgotten at the end
    assert_no_leak(engine)


def test_no_speculation_above_max_concurrency(smollm2_runner: ModelRunner, reference) -> None:
    engine = make_engine(smollm2_runner, ScriptedProposer(full_outputs(reference), 0), speculative_max_concurrency=2)
    outputs = run(engine, *(greedy(k, reference[k][0], 8) for k in ("r0", "r1", "r2")))
    assert all(v[-1].num_verify_steps == 0 for v in outputs.values())
    assert {k: tokens_of(v) for k, v in outputs.items()} == {k: reference[k][1][:8] for k in outputs}


def test_sampled_requests_with_penalties_run_and_stay_in_budget(smollm2_runner: ModelRunner, reference) -> None:
    engine = make_engine(smollm2_runner, speculative="ngram")
    prompt, _ = reference["r0"]
    params = SamplingParams(max_tokens=20, temperature=0.7, top_p=0.9, seed=7, repetition_penalty=1.1, ignore_eos=True)
    first = tokens_of(run(engine, GenerationRequest("s", prompt, params))["s"])
    again = tokens_of(run(engine, GenerationRequest("s", prompt, params))["s"])
    assert len(first) == 20 and first == again  # seeded: reproducible with the same drafts
    assert_no_leak(engine)
