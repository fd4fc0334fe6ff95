"""Read a Llama-family GGUF file: hyperparameters, dequantised weights and tokenizer.

Weights are dequantised to float32 with the `gguf` package (any type it knows: Q4_0/Q4_1/Q8_0/K-quants,
F16, BF16, F32). llama.cpp stores q and k rows of each head rope-interleaved; they are put back in
Hugging Face layout here, so every loader hands `model.hf_to_runtime` the same thing.

Parsing is slow (seconds: the vocabulary is tens of thousands of small fields), which is why
`loader.cache` keeps the result and later starts never come here.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import gguf
import numpy as np
import torch
from torch import Tensor

from engines.builtin.runner.model_config import ModelConfig
from engines.builtin.runner.weights import deinterleave_rope_rows
from engines.builtin.text.tokenizer import Tokenizer, build_byte_level_bpe

SUPPORTED_ARCHITECTURES = {"llama", "mistral", "granite"}  # same tensors and maths as Llama here

LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
T = TypeVar("T")

GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def field_value(reader: gguf.GGUFReader, key: str) -> object:
    """A metadata value as the `gguf` package reads it (int, float, bool, str or a list of them), or None."""
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def typed_field(reader: gguf.GGUFReader, key: str, kind: type[T]) -> T | None:
    value = field_value(reader, key)
    if value is None or isinstance(value, kind):
        return value
    raise ValueError(f"GGUF field {key!r} holds {type(value).__name__}, expected {kind.__name__}")


def list_field(reader: gguf.GGUFReader, key: str, kind: type[T]) -> list[T] | None:
    value = field_value(reader, key)
    if value is None:
        return None
    if isinstance(value, list) and all(isinstance(item, kind) for item in value):
        return value
    raise ValueError(f"GGUF field {key!r} is not a list of {kind.__name__}")


def vocabulary(reader: gguf.GGUFReader) -> list[str]:
    tokens = list_field(reader, "tokenizer.ggml.tokens", str)
    if tokens is None:
        raise ValueError("GGUF file lacks tokenizer.ggml.tokens (its vocabulary)")
    return tokens


def read_config(reader: gguf.GGUFReader, tensor_names: set[str]) -> ModelConfig:
    arch = field_value(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"GGUF architecture {arch!r} is not supported; the built-in engine runs Llama-family models "
            f"({sorted(SUPPORTED_ARCHITECTURES)})"
        )

    def meta_int(key: str, default: int | None = None) -> int:
        value = typed_field(reader, f"{arch}.{key}", int)
        if value is None:
            value = default
        if value is None:
            raise ValueError(f"GGUF file lacks {arch}.{key}")
        return value

    def meta_float(key: str, default: float) -> float:
        value = field_value(reader, f"{arch}.{key}")
        if value is None:
            return default
        if not isinstance(value, int | float):
            raise ValueError(f"GGUF field {arch}.{key} holds {type(value).__name__}, expected a number")
        return float(value)

    hidden, num_heads = meta_int("embedding_length"), meta_int("attention.head_count")
    head_dim = meta_int("attention.key_length", hidden // num_heads)
    vocab = meta_int("vocab_size", 0) or len(vocabulary(reader))
    eos = typed_field(reader, "tokenizer.ggml.eos_token_id", int)
    freq_factors = None
    if "rope_freqs.weight" in tensor_names:
        tensor = next(t for t in reader.tensors if t.name == "rope_freqs.weight")
        freq_factors = tuple(float(x) for x in np.asarray(tensor.data, dtype=np.float32))
    return ModelConfig(
        num_layers=meta_int("block_count"),
        hidden_size=hidden,
        num_heads=num_heads,
        num_kv_heads=meta_int("attention.head_count_kv", num_heads),
        head_dim=head_dim,
        intermediate_size=meta_int("feed_forward_length"),
        vocab_size=vocab,
        max_position_embeddings=meta_int("context_length", 2048),
        rope_theta=meta_float("rope.freq_base", 10000.0),
        rms_norm_eps=meta_float("attention.layer_norm_rms_epsilon", 1e-5),
        tie_word_embeddings="output.weight" not in tensor_names,
        bos_token_id=typed_field(reader, "tokenizer.ggml.bos_token_id", int),
        eos_token_ids=() if eos is None else (eos,),
        rope_freq_factors=freq_factors,
    )


def hf_name(gguf_name: str) -> str | None:
    base, _, suffix = gguf_name.rpartition(".")
    if base.startswith("blk."):
        _, index, part = base.split(".", 2)
        return f"model.layers.{index}.{LAYER_NAMES[part]}.{suffix}" if part in LAYER_NAMES else None
    return f"{GLOBAL_NAMES[base]}.{suffix}" if base in GLOBAL_NAMES else None


def read_weights(reader: gguf.GGUFReader, config: ModelConfig) -> dict[str, Tensor]:
    """Dequantised float32 tensors under Hugging Face names and layout."""
    out = {}
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        if name is None:
            continue  # rope_freqs (read into the config) and anything this engine does not use
        shape = [int(d) for d in reversed(tensor.shape)]
        array = np.ascontiguousarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        if not array.flags.writeable:  # F32 data comes back as a view of the read-only file map
            array = array.copy()
        values = torch.from_numpy(array).reshape(shape)
        if name.endswith("q_proj.weight"):
            values = deinterleave_rope_rows(values, config.num_heads)
        elif name.endswith("k_proj.weight"):
            values = deinterleave_rope_rows(values, config.num_kv_heads)
        out[name] = values.contiguous()
    return out


def read_tokenizer(reader: gguf.GGUFReader, config: ModelConfig) -> Tokenizer:
    kind = field_value(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"GGUF tokenizer model {kind!r} is not supported (byte-level BPE 'gpt2' only)")
    backend = build_byte_level_bpe(
        tokens=vocabulary(reader),
        merges=list_field(reader, "tokenizer.ggml.merges", str) or [],
        token_types=list_field(reader, "tokenizer.ggml.token_type", int) or [],
        pre=typed_field(reader, "tokenizer.ggml.pre", str),
    )
    return Tokenizer(
        backend,
        chat_template=typed_field(reader, "tokenizer.chat_template", str),
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_ids[0] if config.eos_token_ids else None,
        add_bos_token=bool(field_value(reader, "tokenizer.ggml.add_bos_token")),
    )


def read_gguf(path: Path) -> tuple[ModelConfig, dict[str, Tensor], Tokenizer, str]:
    """(config, Hugging Face-layout float32 weights, tokenizer, model name) of a GGUF file."""
    reader = gguf.GGUFReader(path)
    config = read_config(reader, {t.name for t in reader.tensors})
    weights = read_weights(reader, config)
    tokenizer = read_tokenizer(reader, config)
    name = typed_field(reader, "general.name", str) or path.stem
    return config, weights, tokenizer, name
