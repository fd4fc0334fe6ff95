"""The shape of an EAGLE-3 draft head and its config.json, as SGLang and TensorRT-LLM read it.

A head's config.json is a Hugging Face LlamaConfig for one decoder layer, with
`architectures: ["LlamaForCausalLMEagle3"]`, `num_hidden_layers: 1`, `vocab_size` (the target's),
`draft_vocab_size`, and optionally `eagle_config: {"eagle_aux_hidden_state_layer_ids": [...]}`,
the target layers whose outputs feed `fc`. Without it, SGLang captures the inputs of layers
(2, L/2, L-3), i.e. the outputs of layers (1, L/2 - 1, L - 4): `default_aux_layers`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

ARCHITECTURE = "LlamaForCausalLMEagle3"


def default_aux_layers(num_target_layers: int) -> tuple[int, int, int]:
    return (1, num_target_layers // 2 - 1, num_target_layers - 4)


@dataclass(slots=True, frozen=True)
class Eagle3Config:
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int  # the target's
    draft_vocab_size: int
    aux_layers: tuple[int, ...]
    target_hidden_size: int | None = None  # fc's input is len(aux_layers) * this; None: hidden_size
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        if not 0 < self.draft_vocab_size <= self.vocab_size:
            raise ValueError(f"draft_vocab_size={self.draft_vocab_size} must be in [1, vocab_size={self.vocab_size}]")
        if len(self.aux_layers) != 3:
            raise ValueError(f"aux_layers={self.aux_layers}: EAGLE-3 fuses exactly three target layers")

    @property
    def fc_in_features(self) -> int:
        return len(self.aux_layers) * (self.target_hidden_size or self.hidden_size)

    def to_hf(self) -> dict[str, Any]:
        return {
            "architectures": [ARCHITECTURE],
            "model_type": "llama",
            "num_hidden_layers": 1,
            "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "hidden_act": "silu",
            "vocab_size": self.vocab_size,
            "draft_vocab_size": self.draft_vocab_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": False,
            "target_hidden_size": self.target_hidden_size or self.hidden_size,
            "torch_dtype": "float32",
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(self.aux_layers), "use_aux_hidden_state": True},
        }

    @classmethod
    def from_hf(cls, hf: dict[str, Any], num_target_layers: int) -> Eagle3Config:
        archs = hf.get("architectures") or []
        if not any("Eagle3" in a for a in archs):
            raise ValueError(f"architectures={archs}: not an EAGLE-3 head (expected {ARCHITECTURE})")
        if hf.get("num_hidden_layers", 1) != 1:
            raise ValueError(f"num_hidden_layers={hf['num_hidden_layers']}: only one-layer EAGLE-3 heads are supported")
        num_heads = hf["num_attention_heads"]
        eagle = hf.get("eagle_config") or {}
        aux = eagle.get("eagle_aux_hidden_state_layer_ids") or default_aux_layers(num_target_layers)
        return cls(
            hidden_size=hf["hidden_size"],
            num_heads=num_heads,
            num_kv_heads=hf.get("num_key_value_heads") or num_heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // num_heads,
            intermediate_size=hf["intermediate_size"],
            vocab_size=hf["vocab_size"],
            draft_vocab_size=hf.get("draft_vocab_size") or hf["vocab_size"],
            aux_layers=tuple(aux),
            target_hidden_size=hf.get("target_hidden_size"),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
            rope_theta=float(hf.get("rope_theta", 10000.0)),
            max_position_embeddings=hf.get("max_position_embeddings", 8192),
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
