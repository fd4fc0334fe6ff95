"""Read a Llama-family GGUF file: hyperparameters, dequantised weights and tokenizer.

Weights are dequantised to float32 with the `gguf` package (any type it knows: Q4_0/Q4_1/Q8_0/K-quants,
F16, BF16, F32). llama.cpp stores q and k rows of each head rope-interleaved; they are put back in
Hugging Face layout here, so every loader hands `model.hf_to_runtime` the same thing.

Parsing is slow (seconds: the vocabulary is tens of thousands of small fields), which is why
`loader.cache` keeps the result and later starts never come here.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch
from torch import Tensor

from engines.builtin.model_config import ModelConfig
from engines.builtin.tokenizer import Tokenizer, build_byte_level_bpe
from engines.builtin.weights import deinterleave_rope_rows

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
GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def field_value(reader: gguf.GGUFReader, key: str, default: object = None) -> object:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def read_config(reader: gguf.GGUFReader, tensor_names: set[str]) -> ModelConfig:
    arch = field_value(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"GGUF architecture {arch!r} is not supported; the built-in engine runs Llama-family models "
            f"({sorted(SUPPORTED_ARCHITECTURES)})"
        )

    def meta(key: str, default: object = None) -> object:
        return field_value(reader, f"{arch}.{key}", default)

    hidden, num_heads = int(meta("embedding_length")), int(meta("attention.head_count"))
    head_dim = int(meta("attention.key_length", hidden // num_heads))
    vocab = meta("vocab_size") or len(field_value(reader, "tokenizer.ggml.tokens"))
    eos = field_value(reader, "tokenizer.ggml.eos_token_id")
    freq_factors = None
    if "rope_freqs.weight" in tensor_names:
        tensor = next(t for t in reader.tensors if t.name == "rope_freqs.weight")
        freq_factors = tuple(float(x) for x in np.asarray(tensor.data, dtype=np.float32))
    return ModelConfig(
        num_layers=int(meta("block_count")),
        hidden_size=hidden,
        num_heads=num_heads,
        num_kv_heads=int(meta("attention.head_count_kv", num_heads)),
        head_dim=head_dim,
        intermediate_size=int(meta("feed_forward_length")),
        vocab_size=int(vocab),
        max_position_embeddings=int(meta("context_length", 2048)),
        rope_theta=float(meta("rope.freq_base", 10000.0)),
        rms_norm_eps=float(meta("attention.layer_norm_rms_epsilon", 1e-5)),
        tie_word_embeddings="output.weight" not in tensor_names,
        bos_token_id=field_value(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=() if eos is None else (int(eos),),
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
        tokens=field_value(reader, "tokenizer.ggml.tokens"),
        merges=field_value(reader, "tokenizer.ggml.merges") or [],
        token_types=field_value(reader, "tokenizer.ggml.token_type") or [],
        pre=field_value(reader, "tokenizer.ggml.pre"),
    )
    return Tokenizer(
        backend,
        chat_template=field_value(reader, "tokenizer.chat_template"),
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_ids[0] if config.eos_token_ids else None,
        add_bos_token=bool(field_value(reader, "tokenizer.ggml.add_bos_token", False)),
    )


def read_gguf(path: Path) -> tuple[ModelConfig, dict[str, Tensor], Tokenizer, str]:
    """(config, Hugging Face-layout float32 weights, tokenizer, model name) of a GGUF file."""
    reader = gguf.GGUFReader(path)
    config = read_config(reader, {t.name for t in reader.tensors})
    weights = read_weights(reader, config)
    tokenizer = read_tokenizer(reader, config)
    name = field_value(reader, "general.name") or path.stem
    return config, weights, tokenizer, str(name)


def read_gguf_tokenizer(path: Path) -> Tokenizer:
    """The tokenizer of a GGUF file alone (no weights read): for tools that need only the vocabulary."""
    reader = gguf.GGUFReader(path)
    return read_tokenizer(reader, read_config(reader, {t.name for t in reader.tensors}))
