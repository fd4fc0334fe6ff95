"""A BERT encoder in plain torch: the architecture of `BertModel` (post-LayerNorm, GELU, absolute
positions), read from a Hugging Face config.json and model.safetensors.

Weights keep their Hugging Face names (`embeddings.word_embeddings.weight`,
`encoder.layer.{i}.attention.self.query.weight`, ...), with or without a `bert.` prefix; the pooler
is not used (sentence-transformers pools token states itself).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import Tensor


@dataclass(frozen=True, slots=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of {self.num_attention_heads} heads")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_file(cls, path: Path) -> BertConfig:
        raw = json.loads(path.read_text())
        if raw.get("model_type") not in ("bert", None) or raw.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"{path}: not a BERT config with GELU (model_type {raw.get('model_type')!r})")
        if raw.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"{path}: only absolute position embeddings are supported")
        return cls(**{name: raw[name] for name in cls.__dataclass_fields__ if name in raw})


def read_weights(path: Path, dtype: torch.dtype = torch.float32) -> dict[str, Tensor]:
    """model.safetensors with Hugging Face names, the `bert.` prefix removed when present."""
    return {name.removeprefix("bert."): t.to(dtype) for name, t in load_file(path).items()}


class BertEncoder:
    """Token ids -> last hidden states. Pure functions of the weights; no autograd."""

    def __init__(self, config: BertConfig, weights: dict[str, Tensor]) -> None:
        self.config = config
        self.w = weights

    def _layer_norm(self, x: Tensor, prefix: str) -> Tensor:
        w = self.w
        return F.layer_norm(x, (x.shape[-1],), w[f"{prefix}.weight"], w[f"{prefix}.bias"], self.config.layer_norm_eps)

    def _linear(self, x: Tensor, prefix: str) -> Tensor:
        return F.linear(x, self.w[f"{prefix}.weight"], self.w[f"{prefix}.bias"])

    @torch.inference_mode()
    def __call__(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """input_ids, attention_mask: [b, s] (mask 1 for tokens, 0 for padding) -> hidden [b, s, d]."""
        c, w = self.config, self.w
        b, s = input_ids.shape
        positions = torch.arange(s, device=input_ids.device)
        x = (
            w["embeddings.word_embeddings.weight"][input_ids]
            + w["embeddings.position_embeddings.weight"][positions]
            + w["embeddings.token_type_embeddings.weight"][0]  # one segment
        )
        x = self._layer_norm(x, "embeddings.LayerNorm")
        # additive mask: padding keys get -inf before the softmax; [b, 1, 1, s]
        bias = torch.zeros(b, 1, 1, s, dtype=x.dtype, device=x.device)
        bias.masked_fill_(attention_mask[:, None, None, :] == 0, torch.finfo(x.dtype).min)
        for i in range(c.num_hidden_layers):
            p = f"encoder.layer.{i}"
            # q, k, v: [b, heads, s, head_dim]
            q, k, v = (
                self._linear(x, f"{p}.attention.self.{name}").view(b, s, -1, c.head_dim).transpose(1, 2)
                for name in ("query", "key", "value")
            )
            scores = q @ k.transpose(-1, -2) / math.sqrt(c.head_dim) + bias
            context = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, c.hidden_size)
            attended = x + self._linear(context, f"{p}.attention.output.dense")
            x = self._layer_norm(attended, f"{p}.attention.output.LayerNorm")
            hidden = F.gelu(self._linear(x, f"{p}.intermediate.dense"))
            x = self._layer_norm(x + self._linear(hidden, f"{p}.output.dense"), f"{p}.output.LayerNorm")
        return x
