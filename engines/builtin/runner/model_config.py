"""The shape and constants of a Llama-family model, and their Hugging Face spelling."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(slots=True, frozen=True)
class ModelConfig:
    """The shape and constants of a Llama-family model."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # Per-frequency divisors of the rotary inverse frequencies (Llama 3.1 "llama3" rope scaling,
    # or a GGUF's rope_freqs tensor); None for plain rope.
    rope_freq_factors: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for rotary embeddings")
        if self.rope_freq_factors is not None and len(self.rope_freq_factors) != self.head_dim // 2:
            raise ValueError("rope_freq_factors must have head_dim / 2 entries")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        for key in ("eos_token_ids", "rope_freq_factors"):
            if values.get(key) is not None:
                values[key] = tuple(values[key])
        return cls(**values)

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        """From a Hugging Face LlamaConfig dict (config.json)."""
        num_heads = hf["num_attention_heads"]
        head_dim = hf.get("head_dim") or hf["hidden_size"] // num_heads
        eos = hf.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        return cls(
            num_layers=hf["num_hidden_layers"],
            hidden_size=hf["hidden_size"],
            num_heads=num_heads,
            num_kv_heads=hf.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            intermediate_size=hf["intermediate_size"],
            vocab_size=hf["vocab_size"],
            max_position_embeddings=hf.get("max_position_embeddings", 2048),
            rope_theta=float(hf.get("rope_theta") or (hf.get("rope_parameters") or {}).get("rope_theta", 10000.0)),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=eos_ids,
            rope_freq_factors=llama3_freq_factors(hf.get("rope_scaling") or hf.get("rope_parameters"), head_dim, hf),
        )

    def to_hf(self) -> dict[str, Any]:
        """A Hugging Face LlamaConfig dict (plain rope only), for writing config.json."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "num_hidden_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_ids),
            "hidden_act": "silu",
        }


def llama3_freq_factors(scaling: dict[str, Any] | None, head_dim: int, hf: dict[str, Any]) -> tuple[float, ...] | None:
    """Llama 3.1's rope scaling as per-frequency divisors: long wavelengths are slowed by `factor`,
    short ones kept, and the band between is blended smoothly."""
    if not scaling or scaling.get("rope_type", scaling.get("type")) != "llama3":
        return None
    theta = float(hf.get("rope_theta") or scaling.get("rope_theta", 10000.0))
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    out = []
    for i in range(head_dim // 2):
        wavelen = 2 * math.pi * theta ** (2 * i / head_dim)
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(float(factor))
        else:  # 1/divisor blends 1/factor and 1 by smooth in [0, 1]
            smooth = (old_len / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return tuple(out)
