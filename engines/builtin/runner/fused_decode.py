"""A decode step of a few rows in one C++ call (engines/builtin/runner/kernels/decode_step.cpp), for the q4_1 format.

At one row a step of model.py's forward pass is ~20 torch ops per layer, each costing more in dispatch than
in arithmetic. When every decoder weight is Q4_1 and the head Q8_0 (BlockLinear, edgerun's kernels) and the
KV cache float32 on the CPU, a step whose items are all single-token decodes, 1 to `MAX_ROWS` of them, runs
through `torch.ops.edgerun.decode_step` instead: the same maths and the same matmul kernels, in one call.

A speculative verify row (k + 1 tokens of one sequence at positions p .. p + k, logits at each) runs there
too, as k + 1 rows sharing the sequence's block table. In each layer the kernel writes every row's k/v into
its slot before any row attends, and row i attends over positions 0 .. p + i of its table: the drafts before
it in the same layer, none after, which is the causal attention of model.py's verify chunk. A step holding a
verify row runs fused up to `MAX_TOKENS` new tokens in all.

model.py stays the reference and runs everything else (prefill chunks, longer steps, other formats, CUDA,
EDGERUN_KERNELS=off). The runner picks the step's thread count (thread_choice.py).

Rows under LoRA adapters run fused too: the step adds each row's low-rank delta after the base matmul of
every linear its adapter targets (`FusedLora`, runner/lora.py), so rows without one are computed exactly as
without neighbours' adapters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from engines.builtin.runner.linear import BlockLinear
from engines.builtin.runner.lora import FusedLora
from engines.builtin.runner.model_config import ModelConfig
from engines.builtin.runner.weights import LlamaWeights

NO_LORA: tuple[list[Tensor], list[Tensor], list[int], None, int] = ([], [], [], None, 0)  # decode_step's LoRA arguments, unused


@dataclass(slots=True, eq=False)
class FusedDecode:
    """The tensors `decode_step` reads, gathered once; call it with one step's rows (one new token each)."""

    embed: Tensor  # [V, D] float32
    # per layer: attn_norm, codes and scales of qkv and of o, mlp_norm, codes and scales of gate_up and of down
    layers: list[Tensor]
    kv_caches: list[Tensor]
    inv_freq: Tensor  # [hd / 2] float32
    norm: Tensor
    head: BlockLinear
    config: ModelConfig
    block_size: int

    # up to this many decode rows a step runs fused: the kernel's matmuls take 4 rows per pass over a tile of weights.
    # SmolLM2, context 128, CPU ms per step fused / torch path (int4 op from 3 rows), 1 thread: 2 rows 12.4 / 16.2,
    # 3 rows 16.9 / 21.2, 4 rows 22.4 / 24.7, 8 rows 45.6 / 40.9 (2 passes: worse); 2 threads gain at 2-6 rows too
    MAX_ROWS = 4
    # ... and up to this many new tokens a step with verify rows (1 + the engine's default 8 drafts), whose torch path
    # runs each as a causal chunk (`wide` from 3 tokens: torch's int4 op on AVX-512). Each more row costs the kernels
    # its arithmetic again. SmolLM2, context 150 (benchmarks/speculative/verify_cost.py, BENCHMARKS.md "Speculative
    # decoding"), 1 thread, CPU ms per step fused / torch: 1 + 1 18.1 / 25.2, 1 + 2 23.0 / 28.3,
    # 1 + 4 38.0 / 38.9, 1 + 6 46.2 / 44.9, 1 + 8 63.7 / 54.6 (1.17x); 2 threads on a busy machine (load 4.8), wall
    # ms: 1 + 4 39.2 / 333.7, 1 + 8 80.8 / 358.1: the torch path's ~1,000 barriers a step stall, while the fused
    # step runs on the thread count that has been faster lately (thread_choice.py)
    MAX_TOKENS = 9

    @classmethod
    def may_build(cls, weights: LlamaWeights, config: ModelConfig, kv_caches: list[Tensor], inv_freq: Tensor) -> FusedDecode | None:
        """The fused step over these weights, or None where it does not apply (a weight not in the q4_1 format,
        a cache not float32 on the CPU, the kernels not loaded)."""
        head = weights.lm_head
        linears = [getattr(layer, name) for layer in weights.layers for name in ("qkv", "o", "gate_up", "down")]
        if not (isinstance(head, BlockLinear) and head.format == "q8_0"):
            return None
        if not all(isinstance(w, BlockLinear) and w.format == "q4_1" for w in linears):
            return None
        if not all(c.dtype == torch.float32 and c.device.type == "cpu" and c.is_contiguous() for c in kv_caches):
            return None
        if weights.embed.dtype != torch.float32 or not hasattr(torch.ops.edgerun, "decode_step"):
            return None
        layers: list[Tensor] = []
        for layer in weights.layers:
            layers.append(layer.attn_norm.contiguous())
            for name in ("qkv", "o"):
                linear = getattr(layer, name)
                layers += [linear.codes, linear.scales]
            layers.append(layer.mlp_norm.contiguous())
            for name in ("gate_up", "down"):
                linear = getattr(layer, name)
                layers += [linear.codes, linear.scales]
        return cls(weights.embed, layers, kv_caches, inv_freq.float().contiguous(), weights.norm.contiguous(), head,
                   config, kv_caches[0].shape[1])

    def can_run(self, token_counts: Sequence[int]) -> bool:
        """Whether a step of decodes (1 new token) and verify rows (n > 1, logits at each) with these numbers of new
        tokens runs fused: 1 to MAX_ROWS decodes, or up to MAX_TOKENS tokens in all with a verify row among them."""
        if not token_counts or min(token_counts) < 1:
            return False
        return sum(token_counts) <= (self.MAX_ROWS if max(token_counts) == 1 else self.MAX_TOKENS)

    def __call__(self, token_ids: list[int], positions: list[int], block_tables: list[list[int]],
                 aux_layers: tuple[int, ...] = (), num_threads: int = 0, lora: FusedLora | None = None
                 ) -> tuple[Tensor, Tensor | None]:
        """One new token per row at `positions` -> (logits [rows, V] float32, the residual stream after each layer
        of aux_layers [rows, len(aux_layers) * D], None without); the rows' k/v go into their cache slots, each layer's
        all before any row attends (so rows of one sequence at consecutive positions attend causally). On
        `num_threads` OpenMP threads (0: as many as torch uses on this thread). `lora`: the rows' adapters."""
        num_blocks = [pos // self.block_size + 1 for pos in positions]
        width = max(num_blocks)
        # padded with -1, which the kernel refuses where a row needs a block (a table too short for its position)
        tables = [table[:n] + [-1] * (width - len(table[:n])) for table, n in zip(block_tables, num_blocks)]
        c = self.config
        logits, aux = torch.ops.edgerun.decode_step(
            self.embed[token_ids], self.layers, self.kv_caches, torch.tensor(positions), torch.tensor(tables),
            self.inv_freq, self.norm, self.head.codes, self.head.scales, list(aux_layers), c.num_heads, c.num_kv_heads,
            c.rms_norm_eps, num_threads, *(NO_LORA if lora is None else (lora.a, lora.b, lora.terms, lora.row_slots, lora.rank)))
        return logits, aux if aux_layers else None
