"""A LoRA adapter in PEFT's format (adapter_config.json + adapter_model.safetensors) and what may be
served: one check, which the gateway runs on upload and the built-in engine again on load.

PEFT stores, per adapted Linear `W [out, in]`, `lora_A [r, in]` and `lora_B [out, r]` under names
like `base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight`; the layer becomes
`W x + s * B (A x)` with `s = lora_alpha / r` (`lora_alpha / sqrt(r)` with `use_rslora`).

Served: plain LoRA (no DoRA, no trained bias, no per-module rank or alpha patterns), rank 1..32
(Workers AI's limit), the Llama projections below as targets, every tensor's shape matching the base
model's weight. Each refusal is an `AdapterError` whose message says what to change. Pure: no torch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
MAX_RANK = 32
# PEFT module name -> the Llama submodule holding it
MODULES: dict[str, str] = {
    "q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
    "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp",
}
KEY = re.compile(r"^(?:base_model\.model\.)?model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.default)?\.weight$")


class AdapterError(ValueError):
    """An adapter that cannot be served; the message says what to change."""


@dataclass(slots=True, frozen=True)
class AdapterConfig:
    rank: int
    alpha: float
    target_modules: tuple[str, ...]  # PEFT names, sorted
    use_rslora: bool = False

    @property
    def scale(self) -> float:
        return self.alpha / (math.sqrt(self.rank) if self.use_rslora else self.rank)


@dataclass(slots=True, frozen=True)
class BaseShape:
    """What an adapter must fit: the base model's layer count and each module's weight (out, in)."""

    num_layers: int
    modules: Mapping[str, tuple[int, int]]

    @classmethod
    def llama(cls, num_layers: int, hidden: int, num_heads: int, num_kv_heads: int, head_dim: int, intermediate: int) -> BaseShape:
        q, kv = num_heads * head_dim, num_kv_heads * head_dim
        return cls(num_layers, {
            "q_proj": (q, hidden), "k_proj": (kv, hidden), "v_proj": (kv, hidden), "o_proj": (hidden, q),
            "gate_proj": (intermediate, hidden), "up_proj": (intermediate, hidden), "down_proj": (hidden, intermediate),
        })


def parse_config(raw: Any, max_rank: int = MAX_RANK) -> AdapterConfig:
    """adapter_config.json's object -> AdapterConfig, or AdapterError saying what is not served."""
    if not isinstance(raw, dict):
        raise AdapterError(f"{CONFIG_FILE} must hold a JSON object")
    if raw.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"peft_type {raw.get('peft_type')!r} is not served: only LoRA adapters (peft_type LORA)")
    rank = raw.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 1 <= rank <= max_rank:
        raise AdapterError(f"rank r={rank!r} is not served: use an integer rank from 1 to {max_rank}")
    alpha = raw.get("lora_alpha", rank)
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or alpha <= 0:
        raise AdapterError(f"lora_alpha={alpha!r} must be a positive number")
    targets = raw.get("target_modules")
    if isinstance(targets, str):
        targets = [targets]
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
        raise AdapterError('target_modules must list the adapted modules, e.g. ["q_proj", "v_proj"]')
    unknown = sorted(set(targets) - set(MODULES))
    if unknown:
        raise AdapterError(f"target_modules {unknown} are not served: use any of {sorted(MODULES)}")
    for key in ("rank_pattern", "alpha_pattern"):
        if raw.get(key):
            raise AdapterError(f"{key} is not served: use one rank and alpha for every module")
    if raw.get("use_dora"):
        raise AdapterError("DoRA adapters (use_dora) are not served: use plain LoRA")
    if raw.get("bias", "none") != "none":
        raise AdapterError('adapters with trained biases are not served: use bias "none"')
    if raw.get("fan_in_fan_out"):
        raise AdapterError("fan_in_fan_out is for GPT-2 style Conv1D layers: Llama adapters leave it false")
    return AdapterConfig(rank, float(alpha), tuple(sorted(set(targets))), bool(raw.get("use_rslora", False)))


def check_tensors(config: AdapterConfig, shapes: Mapping[str, tuple[int, ...]], base: BaseShape) -> None:
    """Check the safetensors file's tensor names and shapes (`shapes`: name -> shape) against the base model."""
    seen: set[tuple[int, str, str]] = set()
    for name, shape in shapes.items():
        match = KEY.match(name)
        if match is None:
            raise AdapterError(f"tensor {name!r} is not a LoRA weight of a Llama layer (expected names like "
                               "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight)")
        layer, part, module, side = int(match[1]), match[2], match[3], match[4]
        if module not in config.target_modules or MODULES[module] != part:
            raise AdapterError(f"tensor {name!r} adapts {part}.{module}, which target_modules does not list")
        if not 0 <= layer < base.num_layers:
            raise AdapterError(f"tensor {name!r}: the base model has layers 0..{base.num_layers - 1}")
        out, inp = base.modules[module]
        want = (config.rank, inp) if side == "A" else (out, config.rank)
        if tuple(shape) != want:
            raise AdapterError(f"tensor {name!r} has shape {list(shape)} but rank {config.rank} on this base model "
                               f"needs {list(want)}: was the adapter trained for another model or rank?")
        seen.add((layer, module, side))
    if not seen:
        raise AdapterError(f"{WEIGHTS_FILE} holds no LoRA weights")
    for layer, module, side in seen:
        if (layer, module, "B" if side == "A" else "A") not in seen:
            raise AdapterError(f"layer {layer} {module} has lora_{side} but not its pair")


def pair_name(a_name: str) -> str:
    """The lora_B tensor's name that goes with lora_A tensor `a_name`."""
    match = KEY.match(a_name)
    assert match is not None and match[4] == "A", a_name
    return a_name[: match.start(4)] + "B" + a_name[match.end(4) :]
