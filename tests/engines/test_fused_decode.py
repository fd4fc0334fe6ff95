"""The fused decode step (engines/builtin/runner/fused_decode.py, kernels/decode_step.cpp) against model.py's torch path
with the same q4_1 weights: logits, the k/v it writes, aux hidden states and long greedy runs agree, for decode
rows and for speculative verify rows (k + 1 tokens of one sequence, causal within the row), and rows under LoRA
adapters."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from engines.base import GenerationRequest
from engines.builtin.config import EngineConfig
from engines.builtin.engine.llm_engine import LLMEngine
from engines.builtin.loader.peft import load_adapter
from engines.builtin.runner import kernels
from engines.builtin.runner.fused_decode import FusedDecode
from engines.builtin.runner.model_runner import ForwardItem, ModelRunner, RunOutput
from engines.builtin.runner.quant import dequantize_q4_1, dequantize_q8_0, q4_1_blocks, q8_0_blocks
from engines.builtin.speculative.factory import build_proposer
from engines.builtin.speculative.proposer import DraftInput
from engines.sampling_params import SamplingParams
from tests.engines.eagle3.conftest import random_head_for
from tests.engines.lora_files import write_adapter
from training.eagle3.export import save_head
from training.eagle3.features import target_features

pytestmark = pytest.mark.skipif(not kernels.cpu_has_avx2(), reason="edgerun's kernels need x86 AVX2, FMA and F16C")

BLOCK = 16  # the engine's default block size, as the runners here use


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def num_threads(request: pytest.FixtureRequest) -> Iterator[int]:
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_q4_runner() -> ModelRunner:
    """The random tiny Llama (4 heads, 2 kv heads, head_dim 16) with its weights rounded to Q4_1 (decoder) and
    Q8_0 (tied head), then packed in the q4_1 format as the engine packs a GGUF's."""
    runner = ModelRunner(EngineConfig(model="random:tiny", num_kv_blocks=128, weight_dtype="float32"))
    weights = runner.weights
    for layer in weights.layers:
        for name in ("qkv", "o", "gate_up", "down"):
            setattr(layer, name, dequantize_q4_1(*q4_1_blocks(getattr(layer, name))))
    weights.embed = weights.lm_head = dequantize_q8_0(*q8_0_blocks(weights.embed))  # type: ignore[arg-type]
    weights.pack("q4_1")
    runner.fused = FusedDecode.may_build(weights, runner.model_config, runner.kv_caches, runner.inv_freq)
    return runner


def with_fused(runner: ModelRunner, fused: FusedDecode | None, items: list[ForwardItem],
               aux_layers: tuple[int, ...] = ()) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
    kept = runner.fused
    runner.fused = fused
    try:
        out = runner.run(items, aux_layers)
    finally:
        runner.fused = kept
    return out.logits, out.hidden


def shuffled_blocks(count: int, seed: int, first: int = 0) -> list[int]:
    # a block table that is not a contiguous run (the attention reads it through its table)
    table = list(range(first, first + count))
    random.Random(seed).shuffle(table)
    return table


def check_step(runner: ModelRunner, contexts: list[int], tol: float) -> None:
    """Prefill each row's context (torch path), then decode one token per row, fused and on the torch path
    (in separate blocks): the logits and the k/v the step writes must agree."""
    fused = runner.fused
    assert fused is not None
    vocab = runner.model_config.vocab_size
    blocks_per_row = max(contexts) // BLOCK + 1
    steps: dict[str, list[ForwardItem]] = {"fused": [], "torch": []}
    for path, first in (("fused", 0), ("torch", len(contexts) * blocks_per_row)):
        for row, context in enumerate(contexts):
            table = shuffled_blocks(blocks_per_row, seed=row, first=first + row * blocks_per_row)
            prompt = torch.randint(0, vocab, (context,), generator=torch.Generator().manual_seed(row)).tolist()
            if context > 1:
                runner.execute([ForwardItem(prompt[:-1], 0, table)])
            steps[path].append(ForwardItem(prompt[-1:], context - 1, table))
    fused_logits, _ = with_fused(runner, fused, steps["fused"])
    torch_logits, _ = with_fused(runner, None, steps["torch"])
    assert fused_logits.shape == torch_logits.shape == (len(contexts), vocab)
    assert (fused_logits - torch_logits).abs().max() <= tol * torch_logits.abs().max()
    assert torch.equal(fused_logits.argmax(-1), torch_logits.argmax(-1))
    for a, b in zip(steps["fused"], steps["torch"]):  # the new token's k and v, in every layer's cache
        pos = a.start_pos
        slot_a = a.block_table[pos // BLOCK] * BLOCK + pos % BLOCK
        slot_b = b.block_table[pos // BLOCK] * BLOCK + pos % BLOCK
        for cache in runner.kv_caches:
            flat = cache.view(-1, *cache.shape[2:])
            assert (flat[slot_a] - flat[slot_b]).abs().max() <= max(tol, 1e-3) * flat[slot_b].abs().max() + 1e-6


def test_the_default_runner_decodes_one_to_max_rows_fused(smollm2_default_runner: ModelRunner) -> None:
    runner = smollm2_default_runner
    if runner.config.linear_format != "q4_1":
        pytest.skip("the fused step runs in the q4_1 format only")
    fused = runner.fused
    assert fused is not None and fused.can_run([1]) and fused.can_run([1] * FusedDecode.MAX_ROWS)
    assert not fused.can_run([]) and not fused.can_run([1] * (FusedDecode.MAX_ROWS + 1))
    # steps with verify rows: up to MAX_TOKENS new tokens in all
    assert fused.can_run([FusedDecode.MAX_TOKENS]) and fused.can_run([1, FusedDecode.MAX_TOKENS - 1])
    assert not fused.can_run([FusedDecode.MAX_TOKENS + 1]) and not fused.can_run([1, FusedDecode.MAX_TOKENS])
    # a prefill chunk (logits at its last token only) takes the torch path even when it is short
    table = list(range(300, 302))
    assert runner.fused_for([ForwardItem([5, 6, 7], 3, table, num_logits=3)]) is fused
    assert runner.fused_for([ForwardItem([5, 6, 7], 3, table)]) is None


@pytest.mark.parametrize("contexts", [[1], [31], [32], [33], [17, 330]], ids=["1", "31", "32", "33", "2-rows-17-330"])
def test_smollm2_fused_step_matches_the_torch_path(smollm2_default_runner: ModelRunner, contexts: list[int],
                                                   num_threads: int) -> None:
    if smollm2_default_runner.fused is None:
        pytest.skip("the fused step runs in the q4_1 format only")
    check_step(smollm2_default_runner, contexts, tol=2e-3)


# up to 2 rows the torch path runs the same kernels; from 3 its linear layers take bfloat16 activations (quant.py)
@pytest.mark.parametrize(("contexts", "tol"), [([1], 1e-4), ([16], 1e-4), ([17], 1e-4), ([40, 3], 1e-4), ([5, 60, 16, 33], 1e-2)])
def test_tiny_model_fused_step_matches_the_torch_path(tiny_q4_runner: ModelRunner, contexts: list[int], tol: float,
                                                      num_threads: int) -> None:
    check_step(tiny_q4_runner, contexts, tol)


def test_fused_rows_match_each_row_run_alone(smollm2_default_runner: ModelRunner, num_threads: int) -> None:
    runner = smollm2_default_runner
    if runner.fused is None:
        pytest.skip("the fused step runs in the q4_1 format only")
    contexts = [3, 47, 16, 200][: FusedDecode.MAX_ROWS]
    steps = []
    for row, context in enumerate(contexts):
        table = shuffled_blocks(context // BLOCK + 1, seed=row, first=row * 20)
        prompt = torch.randint(0, 1000, (context,), generator=torch.Generator().manual_seed(row)).tolist()
        runner.execute([ForwardItem(prompt[:-1], 0, table)])
        steps.append(ForwardItem(prompt[-1:], context - 1, table))
    together, _ = with_fused(runner, runner.fused, steps)  # rewriting a row's k/v writes the same values
    alone = torch.cat([with_fused(runner, runner.fused, [item])[0] for item in steps])
    assert (together - alone).abs().max() <= 1e-5 * alone.abs().max()


def test_fused_step_returns_the_aux_hidden_states(tiny_q4_runner: ModelRunner) -> None:
    runner = tiny_q4_runner
    items = {path: [ForwardItem([7], 0, [first]), ForwardItem([9], 0, [first + 1])] for path, first in (("fused", 0), ("torch", 2))}
    _, fused_hidden = with_fused(runner, runner.fused, items["fused"], aux_layers=(0, 1))
    _, torch_hidden = with_fused(runner, None, items["torch"], aux_layers=(0, 1))
    assert fused_hidden is not None and torch_hidden is not None and len(fused_hidden) == 2
    for a, b in zip(fused_hidden, torch_hidden):
        assert a.shape == b.shape == (1, 2 * runner.model_config.hidden_size)
        assert (a - b).abs().max() <= 1e-4 * b.abs().max()


@pytest.mark.parametrize("num_threads", [1], indirect=True)  # one thread: the torch path's 2-thread steps crawl on a busy machine
def test_fused_greedy_generation_matches_the_torch_path(smollm2_default_runner: ModelRunner, num_threads: int) -> None:
    runner = smollm2_default_runner
    if runner.fused is None:
        pytest.skip("the fused step runs in the q4_1 format only")
    prompt = runner.tokenizer.encode("The history of the printing press in Europe began")
    tokens: dict[str, list[int]] = {}
    for path, fused, first in (("fused", runner.fused, 0), ("torch", None, 40)):
        table = list(range(first, first + 40))
        logits, _ = with_fused(runner, None, [ForwardItem(prompt, 0, table)])
        out = [int(logits[-1].argmax())]
        for pos in range(len(prompt), len(prompt) + 160):
            logits, _ = with_fused(runner, fused, [ForwardItem(out[-1:], pos, table)])
            out.append(int(logits[0].argmax()))
        tokens[path] = out
    assert tokens["fused"] == tokens["torch"]


def test_fused_step_refuses_a_block_table_too_short_for_its_position(tiny_q4_runner: ModelRunner) -> None:
    fused = tiny_q4_runner.fused
    assert fused is not None
    with pytest.raises(RuntimeError, match="block id out of range"):
        fused([7], [40], [[0]])  # position 40 needs 3 blocks of 16


def test_fused_step_refuses_an_aux_layer_outside_the_model(tiny_q4_runner: ModelRunner) -> None:
    fused = tiny_q4_runner.fused
    assert fused is not None
    with pytest.raises(RuntimeError, match="aux layer 2 is outside the model's 2 layers"):
        fused([7], [0], [[0]], aux_layers=(0, tiny_q4_runner.model_config.num_layers))


def test_a_fused_step_on_one_thread_leaves_torch_threads_as_they_were(tiny_q4_runner: ModelRunner, num_threads: int) -> None:
    fused = tiny_q4_runner.fused
    assert fused is not None
    alone, _ = fused([7], [0], [[0]], num_threads=1)
    assert torch.get_num_threads() == num_threads
    together, _ = fused([7], [0], [[0]], num_threads=num_threads)
    assert torch.equal(alone, together)  # output rows split over threads: the same arithmetic


@pytest.mark.parametrize("num_threads", [2], indirect=True)
def test_a_split_step_runs_fused_parts_on_the_workers_and_leaves_the_thread_choice_alone(
        smollm2_default_runner: ModelRunner, num_threads: int) -> None:
    runner = smollm2_default_runner
    if runner.fused is None or runner.step_workers is None:
        pytest.skip("needs the q4_1 format and step workers")
    items = [ForwardItem([11 + i], 0, [100 + i]) for i in range(2 * FusedDecode.MAX_ROWS)]  # split into 2 fused parts
    runner.execute(items[:1])  # the main thread's choice has a history
    choice = runner.fused_threads
    history = {size: dict(c.ms_per_row) for size, c in choice.by_class.items()}
    together = runner.execute(items)
    assert runner.fused_threads is choice and {size: c.ms_per_row for size, c in choice.by_class.items()} == history
    alone = torch.cat([runner.execute([item]) for item in items])
    assert (together - alone).abs().max() <= 1e-5 * alone.abs().max()


def test_runners_without_the_q4_1_format_take_the_torch_path(tiny_runner: ModelRunner) -> None:
    assert tiny_runner.fused is None
    assert FusedDecode.may_build(tiny_runner.weights, tiny_runner.model_config, tiny_runner.kv_caches, tiny_runner.inv_freq) is None


# ---- verify rows ----------------------------------------------------------------------------------------------

def verify_tol(num_tokens: int, kernels: float, wide: float) -> float:
    # up to BlockLinear.KERNEL_MAX_ROWS (2) tokens the torch path runs the fused step's kernels; from 3 its linear
    # layers take `wide` (bfloat16 activations in torch's int4 op on AVX-512, else float16 weights): another
    # rounding of the same weights, within the fast mode's stated error (test_quant.py), not the same arithmetic
    return kernels if num_tokens <= 2 else wide


def check_verify_steps(runner: ModelRunner, rows: list[tuple[int, int]], tol: float,
                       aux_layers: tuple[int, ...] = ()) -> None:
    """rows: (cached context, tokens in the row) per item: a decode when 1, else a verify row (logits at every
    token). Prefill each context (torch path), then run the step fused and on the torch path (in separate blocks):
    the logits, each item's aux hidden states and the k/v written at every new position must agree."""
    fused = runner.fused
    assert fused is not None and runner.fused_for([ForwardItem([1] * n, c, [0] * 40, num_logits=n) for c, n in rows])
    vocab = runner.model_config.vocab_size
    blocks_per_row = max(c + n for c, n in rows) // BLOCK + 1
    steps: dict[str, list[ForwardItem]] = {"fused": [], "torch": []}
    for path, first in (("fused", 0), ("torch", len(rows) * blocks_per_row)):
        for row, (context, n) in enumerate(rows):
            table = shuffled_blocks(blocks_per_row, seed=row, first=first + row * blocks_per_row)
            tokens = torch.randint(0, vocab, (context + n,), generator=torch.Generator().manual_seed(row)).tolist()
            runner.execute([ForwardItem(tokens[:context], 0, table)])
            steps[path].append(ForwardItem(tokens[context:], context, table, num_logits=n))
    fused_logits, fused_hidden = with_fused(runner, fused, steps["fused"], aux_layers)
    torch_logits, torch_hidden = with_fused(runner, None, steps["torch"], aux_layers)
    assert fused_logits.shape == torch_logits.shape == (sum(n for _, n in rows), vocab)
    bound = tol * torch_logits.abs().max()
    assert (fused_logits - torch_logits).abs().max() <= bound
    top2 = torch_logits.topk(2, dim=-1).values
    clear = top2[:, 0] - top2[:, 1] > 2 * bound  # the same top token wherever the error allowed cannot swap it
    assert torch.equal(fused_logits.argmax(-1)[clear], torch_logits.argmax(-1)[clear])
    if aux_layers:
        assert fused_hidden is not None and torch_hidden is not None and len(fused_hidden) == len(rows)
        for a, b, (_, n) in zip(fused_hidden, torch_hidden, rows):  # per token of each item
            assert a.shape == b.shape == (n, len(aux_layers) * runner.model_config.hidden_size)
            assert (a - b).abs().max() <= tol * b.abs().max()
    for a, b in zip(steps["fused"], steps["torch"]):  # every new token's k and v, in every layer's cache
        for pos in range(a.start_pos, a.start_pos + len(a.token_ids)):
            slot_a = a.block_table[pos // BLOCK] * BLOCK + pos % BLOCK
            slot_b = b.block_table[pos // BLOCK] * BLOCK + pos % BLOCK
            for cache in runner.kv_caches:
                flat = cache.view(-1, *cache.shape[2:])
                assert (flat[slot_a] - flat[slot_b]).abs().max() <= max(tol, 1e-3) * flat[slot_b].abs().max() + 1e-6


# contexts around the 16-token blocks: 13 + 5 tokens cross into block 1, 15 + 2 starts on the boundary's far side,
# 16 starts a block, 30 + 6 crosses into block 2, 63 + 3 ends in block 4
VERIFY_CONTEXTS = [1, 13, 15, 16, 30, 63]


@pytest.mark.parametrize("num_drafts", range(1, FusedDecode.MAX_TOKENS))
@pytest.mark.parametrize("context", VERIFY_CONTEXTS)
def test_tiny_model_fused_verify_row_matches_the_torch_path(tiny_q4_runner: ModelRunner, context: int, num_drafts: int,
                                                            num_threads: int) -> None:
    check_verify_steps(tiny_q4_runner, [(context, 1 + num_drafts)], verify_tol(1 + num_drafts, 1e-4, 1e-2))


@pytest.mark.parametrize("num_drafts", [1, 2, FusedDecode.MAX_TOKENS - 1])
@pytest.mark.parametrize("context", [14, 32, 200])
def test_smollm2_fused_verify_row_matches_the_torch_path(smollm2_default_runner: ModelRunner, context: int,
                                                         num_drafts: int, num_threads: int) -> None:
    if smollm2_default_runner.fused is None:
        pytest.skip("the fused step runs in the q4_1 format only")
    check_verify_steps(smollm2_default_runner, [(context, 1 + num_drafts)], verify_tol(1 + num_drafts, 2e-3, 3e-2))


@pytest.mark.parametrize("rows", [[(40, 1), (14, 3)], [(14, 3), (5, 1), (30, 2)]], ids=["decode-verify", "verify-decode-verify"])
def test_a_fused_step_of_decodes_and_verify_rows_matches_the_torch_path(tiny_q4_runner: ModelRunner,
                                                                         rows: list[tuple[int, int]]) -> None:
    check_verify_steps(tiny_q4_runner, rows, 1e-2)  # the torch path runs `wide` for 4 or more tokens


@pytest.mark.parametrize("num_drafts", [1, 4])
def test_fused_verify_row_returns_the_aux_hidden_states_per_token(tiny_q4_runner: ModelRunner, num_drafts: int,
                                                                  num_threads: int) -> None:
    check_verify_steps(tiny_q4_runner, [(15, 1 + num_drafts)], verify_tol(1 + num_drafts, 1e-4, 1e-2), aux_layers=(0, 1))


def test_a_fused_verify_row_equals_its_tokens_decoded_one_by_one(smollm2_default_runner: ModelRunner) -> None:
    """The fused step's rows are batch-invariant (each row's own activation blocks, dot products and attention):
    a verify row's logits are, bit for bit, those of decoding its tokens one at a time."""
    runner = smollm2_default_runner
    if runner.fused is None:
        pytest.skip("the fused step runs in the q4_1 format only")
    tokens = torch.randint(0, 1000, (36,), generator=torch.Generator().manual_seed(3)).tolist()
    table = shuffled_blocks(3, seed=3, first=200)
    runner.execute([ForwardItem(tokens[:30], 0, table)])
    together = runner.execute([ForwardItem(tokens[30:], 30, table, num_logits=6)])
    alone = torch.cat([runner.execute([ForwardItem([t], 30 + i, table)]) for i, t in enumerate(tokens[30:])])
    assert torch.equal(together, alone)


def count_fused_tokens(runner: ModelRunner, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of new tokens of every item that runs fused from now on (filled as steps run)."""
    counts: list[int] = []
    run_fused = runner.run_fused

    def counting(fused: FusedDecode, items: list[ForwardItem], aux_layers: tuple[int, ...]) -> RunOutput:
        counts.extend(len(item.token_ids) for item in items)
        return run_fused(fused, items, aux_layers)

    monkeypatch.setattr(runner, "run_fused", counting)
    return counts


def test_eagle3_speculation_with_fused_verify_rows_gives_the_tokens_of_plain_decoding(
        tiny_q4_runner: ModelRunner, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A random EAGLE-3 head reads the target's aux states of every committed token: after a fused verify row those
    come from its per-token rows. One request at a time, so every decode and verify row runs fused."""
    runner = tiny_q4_runner
    save_head(random_head_for(runner), tmp_path)
    fused_tokens = count_fused_tokens(runner, monkeypatch)
    base = {"model": "random:tiny", "num_kv_blocks": 64, "weight_dtype": "float32"}
    config = EngineConfig(**base, speculative="eagle3", speculative_model=str(tmp_path), num_speculative_tokens=3,
                          speculative_adaptive=False)  # type: ignore[arg-type]
    proposer = build_proposer(config, runner)
    seen: list[tuple[int, torch.Tensor]] = []  # (position of the first, aux states) handed to the head
    propose = proposer.propose

    def recording(inputs: list[DraftInput]) -> list[list[int]]:
        seen.extend((i.hidden_start, i.hidden.clone()) for i in inputs if i.hidden is not None)
        return propose(inputs)

    monkeypatch.setattr(proposer, "propose", recording)
    plain, speculating = LLMEngine(EngineConfig(**base), runner), LLMEngine(config, runner, proposer=proposer)  # type: ignore[arg-type]
    for prompt in (list(range(3, 40)), [7, 8, 9, 10] * 5):
        outputs = []
        seen.clear()
        for engine in (plain, speculating):
            engine.add_request(GenerationRequest("r", prompt, SamplingParams(max_tokens=16, ignore_eos=True)))
            out: list[int] = []
            while engine.has_unfinished:
                for output in engine.step():
                    out += output.new_token_ids
            outputs.append(out)
        assert outputs[0] == outputs[1]
        # every committed position's aux states, as a whole forward pass over the final tokens computes them
        expected, _ = target_features(runner.weights, runner.model_config, prompt + outputs[1], proposer.aux_layers)
        ends = list(itertools.accumulate(len(hidden) for _, hidden in seen))
        assert [start for start, _ in seen] == [0] + ends[:-1]  # each position once, in order (the last step's not:
        assert ends[-1] > len(prompt)  # the request finished there and the head was not asked again)
        for start, hidden in seen:
            reference = expected[start : start + len(hidden)]
            assert (hidden - reference).abs().max() <= 1e-2 * reference.abs().max()
    assert speculating.speculator.num_draft_tokens > 0 and max(fused_tokens) == 4  # 3 drafts verified, fused
    assert proposer.caches == {}


@pytest.mark.parametrize("num_threads", [1], indirect=True)
def test_greedy_speculation_with_fused_verify_rows_gives_the_tokens_of_plain_decoding(
        smollm2_default_runner: ModelRunner, num_threads: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """n-gram speculation on a copy task in fast mode: every verify row runs fused, and since the fused rows are
    batch-invariant the greedy output is exactly that of plain (fused) decoding."""
    runner = smollm2_default_runner
    if runner.fused is None:
        pytest.skip("the fused step runs in the q4_1 format only")
    fused_tokens = count_fused_tokens(runner, monkeypatch)
    tok = runner.tokenizer
    text = ('Copy this JSON exactly, changing only "city" to "Paris": '
            '{"name": "Ada Lovelace", "city": "London", "born": 1815, "fields": ["mathematics", "computing"]}')
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]))
    outputs: dict[str, list[int]] = {}
    accepted = 0
    for name, spec in (("plain", {}), ("ngram", {"speculative": "ngram", "speculative_adaptive": False,
                                                  "num_speculative_tokens": FusedDecode.MAX_TOKENS - 1})):
        engine = LLMEngine(EngineConfig(num_kv_blocks=64, **spec), runner)  # type: ignore[arg-type]
        engine.add_request(GenerationRequest(name, prompt, SamplingParams(max_tokens=40, ignore_eos=True)))
        out: list[int] = []
        while engine.has_unfinished:
            for output in engine.step():
                out += output.new_token_ids
                accepted = output.num_accepted_draft_tokens if output.is_finished else accepted
        outputs[name] = out
    assert outputs["ngram"] == outputs["plain"]
    assert accepted > 0 and max(fused_tokens) > 1  # drafts were verified, fused, and some accepted


def test_rows_under_lora_adapters_run_fused_and_match_the_torch_path(tiny_q4_runner: ModelRunner, tmp_path: Path,
                                                                     num_threads: int) -> None:
    """Two adapters of different ranks and targets and a row without one, in one fused step: the adapter rows'
    logits are the torch path's (per-row LoRA, lora.py), and the plain row's are bit for bit the same step's
    without any adapter."""
    runner = tiny_q4_runner
    for slot, (rank, targets) in enumerate([(8, ("q_proj", "v_proj")), (4, ("o_proj", "gate_proj", "down_proj"))]):
        write_adapter(tmp_path / f"a{slot}", runner.model_config, rank, targets, seed=slot, std=0.3)
        runner.lora_slots.install(slot, load_adapter(tmp_path / f"a{slot}", runner.model_config))
    vocab = runner.model_config.vocab_size
    items: list[ForwardItem] = []
    for row, (context, slot) in enumerate([(20, 0), (35, None), (9, 1)]):
        table = shuffled_blocks(3, seed=row, first=90 + 3 * row)
        prompt = torch.randint(0, vocab, (context,), generator=torch.Generator().manual_seed(row)).tolist()
        runner.execute([ForwardItem(prompt[:-1], 0, table)])
        items.append(ForwardItem(prompt[-1:], context - 1, table, lora_slot=slot))
    assert runner.fused_for(items) is runner.fused  # adapter rows no longer leave the fused path
    fused, _ = with_fused(runner, runner.fused, items)
    plain, _ = with_fused(runner, runner.fused, [ForwardItem(i.token_ids, i.start_pos, i.block_table) for i in items])
    torch_path, _ = with_fused(runner, None, items)
    assert torch.equal(fused[1], plain[1]), "a row without an adapter must not see its neighbours'"
    assert (fused[[0, 2]] - plain[[0, 2]]).abs().max() > 1e-2  # the adapters do change their rows
    assert (fused - torch_path).abs().max() <= 1e-2 * torch_path.abs().max()
    assert torch.equal(fused.argmax(-1), torch_path.argmax(-1))
