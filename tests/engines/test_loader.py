"""Loading models: GGUF (with the converted cache), Hugging Face safetensors directories, random presets."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from engines.builtin import loader
from engines.builtin.config import EngineConfig
from engines.builtin.loader import cache, load_model
from engines.builtin.loader import gguf as gguf_loader
from engines.builtin.loader.random import PRESETS, random_weights, runtime_shapes
from engines.builtin.runner.model_config import ModelConfig
from engines.builtin.runner.model_runner import ForwardItem, ModelRunner
from engines.builtin.runner.weights import interleave_rope_rows, runtime_to_hf
from engines.builtin.text.tokenizer import byte_alphabet, byte_level
from tests.engines.fixtures_model import num_params

TINY = PRESETS["tiny"]
PROMPT = list(range(1, 45))


def tiny_hf_weights(seed: int = 1) -> dict[str, torch.Tensor]:
    runtime = random_weights(TINY, seed=seed, device=torch.device("cpu"), dtype=torch.float32)
    runtime["norm"] = torch.rand(TINY.hidden_size) + 0.5  # norms other than 1, so they are checked too
    hf = runtime_to_hf(runtime, TINY)
    # the GGUF below stores the embedding as F16: round it here so both files hold the same numbers
    hf["model.embed_tokens.weight"] = hf["model.embed_tokens.weight"].half().float()
    return hf


def write_hf_dir(directory: Path, hf: dict[str, torch.Tensor], config: ModelConfig = TINY) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    save_file(hf, directory / "model.safetensors")
    (directory / "config.json").write_text(json.dumps(config.to_hf()))
    byte_level().save(directory)
    return directory


def write_gguf(path: Path, hf: dict[str, torch.Tensor], config: ModelConfig = TINY) -> Path:
    """A Llama GGUF as llama.cpp's converter writes one: llama.* metadata, q/k rope-interleaved."""
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name("tiny-test")
    writer.add_block_count(config.num_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_heads)
    writer.add_head_count_kv(config.num_kv_heads)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    spelling = byte_alphabet()
    tokens = [spelling[b] for b in range(256)] + ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens += [f"<unused{i}>" for i in range(config.vocab_size - len(tokens))]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * 256 + [3] * (len(tokens) - 256))
    writer.add_token_merges([])
    writer.add_eos_token_id(258)
    writer.add_chat_template("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}")
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    parts = {
        "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
        "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    }
    for i in range(config.num_layers):
        for hf_part, gguf_part in parts.items():
            names[f"model.layers.{i}.{hf_part}.weight"] = f"blk.{i}.{gguf_part}.weight"
    for hf_name, gguf_name in names.items():
        tensor = hf[hf_name]
        if hf_name.endswith("q_proj.weight"):
            tensor = interleave_rope_rows(tensor, config.num_heads)
        elif hf_name.endswith("k_proj.weight"):
            tensor = interleave_rope_rows(tensor, config.num_kv_heads)
        array = tensor.numpy().astype(np.float16 if gguf_name == "token_embd.weight" else np.float32)
        writer.add_tensor(gguf_name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def last_logits(runner: ModelRunner) -> torch.Tensor:
    return runner.execute([ForwardItem(PROMPT, 0, [0, 1, 2])])


def test_gguf_is_converted_once_then_loaded_from_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hf = tiny_hf_weights()
    path = write_gguf(tmp_path / "tiny.gguf", hf)
    config = EngineConfig(model=str(path), cache_dir=tmp_path / "cache", num_kv_blocks=4)
    first = ModelRunner(config)
    entry = cache.entry_dir(config.cache_dir, path)
    assert cache.is_complete(entry)
    converted = ["model.json", "tokenizer.json", "tokenizer_config.json", "weights.safetensors"]
    # the fast mode may add tensors derived from the weights (cache.write_derived), never anything else
    derived = {"int4.safetensors", "int8.safetensors", "q4_1.safetensors"}
    assert sorted(p.name for p in entry.iterdir() if p.name not in derived) == converted
    assert not [p for p in entry.parent.iterdir() if p.name.startswith(".")]  # no temporary directory left

    def no_parsing(path: Path) -> None:
        raise AssertionError("the GGUF was parsed again")

    monkeypatch.setattr(gguf_loader, "read_gguf", no_parsing)
    monkeypatch.setattr(gguf, "GGUFReader", no_parsing)
    second = ModelRunner(config)
    assert second.model_name == first.model_name == "tiny-test"
    assert second.model_config == first.model_config
    assert second.tokenizer.encode("héllo <|im_end|>") == first.tokenizer.encode("héllo <|im_end|>")
    assert second.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}]) == "[user] hi\n"
    assert torch.equal(last_logits(first), last_logits(second))

    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))  # the file changed
    assert cache.entry_dir(config.cache_dir, path) != entry


def test_gguf_and_safetensors_of_the_same_weights_give_the_same_logits(tmp_path: Path) -> None:
    """The GGUF's llama.cpp q/k layout is undone correctly: both sources compute the same model."""
    hf = tiny_hf_weights()
    gguf = str(write_gguf(tmp_path / "t.gguf", hf))
    from_gguf = ModelRunner(EngineConfig(model=gguf, cache_dir=tmp_path, num_kv_blocks=4, weight_dtype="float32"))
    from_dir = ModelRunner(EngineConfig(model=str(write_hf_dir(tmp_path / "hf", hf)), num_kv_blocks=4, weight_dtype="float32"))
    assert from_gguf.model_config.tie_word_embeddings and from_gguf.model_config.eos_token_ids == (258,)
    torch.testing.assert_close(last_logits(from_gguf), last_logits(from_dir), atol=1e-5, rtol=1e-5)


def test_safetensors_directory_round_trip(tmp_path: Path, tiny_runner: ModelRunner) -> None:
    runtime = {name: t.clone() for name, t in random_weights(TINY, seed=0, device=torch.device("cpu"), dtype=torch.float32).items()}
    directory = write_hf_dir(tmp_path / "tiny-hf", runtime_to_hf(runtime, TINY))
    runner = ModelRunner(EngineConfig(model=str(directory), num_kv_blocks=4, weight_dtype="float32"))
    assert runner.model_name == "tiny-hf"
    # tiny_runner is random:tiny with seed 0 (bitwise equality is too strict: BLAS results depend on alignment)
    torch.testing.assert_close(last_logits(runner), last_logits(tiny_runner), atol=1e-6, rtol=1e-6)
    transformers = pytest.importorskip("transformers")
    hf_model = transformers.LlamaForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = hf_model(torch.tensor([PROMPT])).logits[:, -1]
    torch.testing.assert_close(last_logits(runner), expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    ("preset", "layers", "hidden", "heads", "kv_heads", "vocab", "billions"),
    [
        ("tiny", 2, 64, 4, 2, 512, 0.000106816),
        ("smollm2", 30, 576, 9, 3, 49152, 0.1345),
        ("llama-1b", 16, 2048, 32, 8, 128256, 1.236),
        ("llama-8b", 32, 4096, 32, 8, 128256, 8.030),
    ],
)
def test_random_presets_have_their_shapes(
    preset: str, layers: int, hidden: int, heads: int, kv_heads: int, vocab: int, billions: float
) -> None:
    config = PRESETS[preset]
    shape = (config.num_layers, config.hidden_size, config.num_heads, config.num_kv_heads, config.vocab_size)
    assert shape == (layers, hidden, heads, kv_heads, vocab)
    assert num_params(config) / 1e9 == pytest.approx(billions, rel=0.01)
    shapes = runtime_shapes(config)
    assert sum(math_prod(s) for s in shapes.values()) == num_params(config)
    assert shapes["layers.0.qkv"] == ((heads + 2 * kv_heads) * config.head_dim, hidden)


def math_prod(shape: tuple[int, ...]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def test_smollm2_preset_matches_the_real_model(smollm2_runner: ModelRunner) -> None:
    real = smollm2_runner.model_config
    preset = PRESETS["smollm2"]
    assert num_params(real) == num_params(preset) == 134_515_008  # the GGUF's parameter count
    for field in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size", "vocab_size", "rope_theta"):
        assert getattr(real, field) == getattr(preset, field), field
    assert smollm2_runner.model_name == "Smollm2 135M 8k Lc100K Mix1 Ep2"
    assert smollm2_runner.tokenizer.eos_token_ids >= {2}


def test_random_model_is_seeded_and_has_a_tokenizer(tiny_runner: ModelRunner) -> None:
    again = load_model(EngineConfig(model="random:tiny"))
    other = load_model(EngineConfig(model="random:tiny", seed=1))
    assert torch.equal(again.weights["layers.1.qkv"], tiny_runner.weights.layers[1].qkv)
    assert not torch.equal(other.weights["layers.1.qkv"], again.weights["layers.1.qkv"])
    assert again.tokenizer.decode(again.tokenizer.encode("random ✓")) == "random ✓"
    assert max(again.tokenizer.eos_token_ids) < again.config.vocab_size


def test_bad_model_names_get_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown random model preset 'huge'"):
        load_model(EngineConfig(model="random:huge"))
    with pytest.raises(FileNotFoundError, match="not 'smollm2'"):
        load_model(EngineConfig(model=str(tmp_path / "missing.gguf")))
    (tmp_path / "config.json").write_text(json.dumps(TINY.to_hf()))
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        load_model(EngineConfig(model=str(tmp_path)))
    (tmp_path / "config.json").write_text(json.dumps({**TINY.to_hf(), "model_type": "gpt2"}))
    with pytest.raises(ValueError, match="model_type 'gpt2' is not supported"):
        load_model(EngineConfig(model=str(tmp_path)))


def test_llama3_rope_scaling_is_read_from_config_json() -> None:
    scaling = {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    hf = {**TINY.to_hf(), "rope_theta": 500000.0, "rope_scaling": scaling}
    hf["head_dim"], hf["hidden_size"], hf["num_attention_heads"] = 128, 512, 4
    factors = ModelConfig.from_hf(hf).rope_freq_factors
    assert factors is not None and len(factors) == 64
    assert factors[0] == 1.0 and factors[-1] == 8.0  # high frequencies kept, low ones slowed by `factor`
    assert all(a <= b for a, b in itertools.pairwise(factors))


def test_loader_module_finds_smollm2_through_find_spec() -> None:
    assert loader.smollm2_gguf_path().name == "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_random_models_borrow_smollm2s_tokenizer_when_the_vocabulary_fits(smollm2_runner: ModelRunner) -> None:
    cache_dir = EngineConfig().cache_dir  # where smollm2_runner's conversion lives
    big = loader.random_model_tokenizer(PRESETS["llama-1b"], cache_dir)
    assert big.encode("Hello world") == smollm2_runner.tokenizer.encode("Hello world")
    small = loader.random_model_tokenizer(TINY, cache_dir)
    assert small.vocab_size == 259 <= TINY.vocab_size
