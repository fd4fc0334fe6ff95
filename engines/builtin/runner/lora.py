"""Per-row LoRA: rows of one batch run under different adapters (or none), S-LoRA / Punica style.

The base weights are never merged with an adapter: every row goes through the base linear, then the
rows that have an adapter get its delta `B (A x)` added to their module's output columns. Resident
adapters sit in slots of per-module buffers (`LoraSlots`): A [S, R, in] and B [S, out, R] per layer,
zero beyond an adapter's own rank, so a step may mix ranks. A step's rows are described once
(`LoraBatch`), then each adapted module of each layer applies the delta in two shapes:

    decode rows     one token per row, grouped by adapter (k groups of at most m rows, padded): each
                    distinct adapter's A and B gathered once, two batched matmuls (Punica's BGMV, one
                    matrix per adapter rather than per row): h = x_g A_g^T [k, m, r], delta = h B_g^T
    prefill chunks  many tokens of one adapter: two plain matmuls over the chunk's rows (SGMV's segment)

Rows without an adapter are never touched, so their output is bit for bit what it is without
neighbours' adapters. Only the modules some row's adapter targets are visited, at the step's largest
rank.

A step that runs fused (fused_decode.py: a few decodes over q4_1 weights) takes its LoRA as `FusedLora`:
the same slot buffers, unsliced, as terms of the C++ step (kernels/decode_step.cpp), which adds each
row's delta after the base matmul of each targeted linear, so adapter rows keep the fused path.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from engines.builtin.loader.peft import LoraAdapter, module_columns
from engines.builtin.runner.model_config import ModelConfig


@dataclass(slots=True)
class ModuleSlots:
    """One PEFT module's buffers, per layer: A [S, R, in] and B [S, out, R]."""

    linear: str  # the runtime linear it adds to (qkv, o, gate_up, down)
    start: int  # its output columns [start, end) there
    end: int
    a: list[Tensor]
    b: list[Tensor]


class LoraSlots:
    """`num_slots` resident adapters' weights, by module, on the model's device and dtype.

    Buffers are made for a module the first time an adapter targets it, at that adapter's rank, and
    grow when a larger rank arrives. `install(slot, adapter)` writes an adapter into a slot (zeroing what
    the slot held); the engine decides which adapter lives in which slot (engine/adapters.py)."""

    def __init__(self, config: ModelConfig, num_slots: int, device: torch.device, dtype: torch.dtype) -> None:
        self.config = config
        self.num_slots = num_slots
        self.device = device
        self.dtype = dtype
        self.columns = module_columns(config)
        self.modules: dict[str, ModuleSlots] = {}
        self.rank = 0  # the buffers' rank R
        self.slot_rank = [0] * num_slots
        self.slot_modules: list[frozenset[str]] = [frozenset()] * num_slots
        self._fused_terms: dict[frozenset[str], tuple[list[Tensor], list[Tensor], list[int]]] = {}

    def install(self, slot: int, adapter: LoraAdapter) -> None:
        if adapter.rank > self.rank:
            self.grow(adapter.rank)
        for module in set(adapter.config.target_modules) | self.slot_modules[slot]:
            slots = self.module_slots(module)
            for layer in range(self.config.num_layers):
                slots.a[layer][slot].zero_()
                slots.b[layer][slot].zero_()
        r = adapter.rank
        for (layer, module), (a, b) in adapter.weights.items():
            slots = self.modules[module]
            slots.a[layer][slot, :r].copy_(a)
            slots.b[layer][slot, :, :r].copy_(b)
        self.slot_rank[slot] = r
        self.slot_modules[slot] = frozenset(adapter.config.target_modules)

    def module_slots(self, module: str) -> ModuleSlots:
        slots = self.modules.get(module)
        if slots is None:
            linear, start, end = self.columns[module]
            inp = self.config.intermediate_size if module == "down_proj" else (
                self.config.num_heads * self.config.head_dim if module == "o_proj" else self.config.hidden_size)
            n, r, layers = self.num_slots, self.rank, range(self.config.num_layers)
            dev, dtype = self.device, self.dtype
            slots = ModuleSlots(linear, start, end, [torch.zeros(n, r, inp, device=dev, dtype=dtype) for _ in layers],
                                [torch.zeros(n, end - start, r, device=dev, dtype=dtype) for _ in layers])
            self.modules[module] = slots
            self._fused_terms.clear()
        return slots

    def grow(self, rank: int) -> None:
        for slots in self.modules.values():
            slots.a = [torch.cat([a, a.new_zeros(a.shape[0], rank - self.rank, a.shape[2])], dim=1) for a in slots.a]
            slots.b = [torch.cat([b, b.new_zeros(b.shape[0], b.shape[1], rank - self.rank)], dim=2) for b in slots.b]
        self.rank = rank
        self._fused_terms.clear()

    def fused(self, row_slots: list[int | None]) -> FusedLora | None:
        """The LoRA of a fused step whose rows (one token each) run under these slots; None when none has one."""
        used = {slot for slot in row_slots if slot is not None}
        if not used:
            return None
        targeted = frozenset().union(*(self.slot_modules[slot] for slot in used))
        terms = self._fused_terms.get(targeted)
        if terms is None:
            a: list[Tensor] = []
            b: list[Tensor] = []
            ints: list[int] = []
            for layer in range(self.config.num_layers):
                for module in sorted(targeted):
                    slots = self.modules[module]
                    a.append(slots.a[layer])
                    b.append(slots.b[layer])
                    ints += [layer, FUSED_LINEARS.index(slots.linear), slots.start, slots.end]
            terms = self._fused_terms[targeted] = (a, b, ints)
        rows = torch.tensor([-1 if slot is None else slot for slot in row_slots], dtype=torch.long)
        return FusedLora(*terms, rows, max(self.slot_rank[slot] for slot in used))


FUSED_LINEARS = ("qkv", "o", "gate_up", "down")  # the C++ step's numbering of a layer's linears


@dataclass(frozen=True, slots=True)
class FusedLora:
    """A fused step's LoRA: per (layer, targeted module) a term (its A [S, R, in] and B [S, out, R] buffers, and
    layer, linear, start, end in `terms`), each row's slot (-1: none) and the step's largest rank."""

    a: list[Tensor]
    b: list[Tensor]
    terms: list[int]
    row_slots: Tensor  # [rows] int64
    rank: int


@dataclass(slots=True)
class LoraBatch:
    """One step's rows by adapter slot (see `prepare`), and `apply` for each layer's linears."""

    slots: LoraSlots
    rank: int  # the step's largest adapter rank
    modules: dict[str, list[str]]  # runtime linear -> the PEFT modules some row's adapter targets
    decode_rows: Tensor | None  # [n] packed rows of single-token items that have an adapter, grouped by slot
    group_slots: Tensor | None  # [k] the distinct slots of those rows
    group_rows: Tensor | None  # [k * m] each group's rows, padded with its first (decode_rows' order: `picked`)
    picked: Tensor | None  # [n] where each of decode_rows sits in the [k * m] padded layout
    segments: list[tuple[int, int, int]] = field(default_factory=list)  # (start, end, slot) of multi-token items

    @classmethod
    def prepare(cls, slots: LoraSlots, rows: list[tuple[int, int, int | None]], device: torch.device) -> LoraBatch | None:
        """`rows`: each item's packed rows [start, end) and slot (None: base model). None when no row has one."""
        used = [(start, end, slot) for start, end, slot in rows if slot is not None]
        if not used:
            return None
        decodes = [(start, slot) for start, end, slot in used if end - start == 1]
        segments = [(start, end, slot) for start, end, slot in used if end - start > 1]
        targeted = frozenset().union(*(slots.slot_modules[slot] for _, _, slot in used))
        modules: dict[str, list[str]] = {}
        for module in sorted(targeted):
            modules.setdefault(slots.columns[module][0], []).append(module)
        decode_rows = group_slots = group_rows = picked = None
        if decodes:
            groups: dict[int, list[int]] = {}
            for row, slot in decodes:
                groups.setdefault(slot, []).append(row)
            m = max(len(rows) for rows in groups.values())
            ordered = [row for rows in groups.values() for row in rows]
            padded = [row for rows in groups.values() for row in rows + [rows[0]] * (m - len(rows))]
            where = [g * m + i for g, rows in enumerate(groups.values()) for i in range(len(rows))]

            def as_tensor(values: list[int]) -> Tensor:
                return torch.tensor(values, dtype=torch.long, device=device)

            decode_rows, group_slots = as_tensor(ordered), as_tensor(list(groups))
            group_rows, picked = as_tensor(padded), as_tensor(where)
        rank = max(slots.slot_rank[slot] for _, _, slot in used)
        return cls(slots, rank, modules, decode_rows, group_slots, group_rows, picked, segments)

    def apply(self, layer: int, linear: str, x: Tensor, y: Tensor) -> None:
        """Add the rows' deltas of `linear` in decoder layer `layer` into y [T, out]; x [T, in] is its input."""
        modules = self.modules.get(linear)
        if not modules:
            return
        r = self.rank
        xg = None
        if self.group_rows is not None:
            assert self.group_slots is not None
            xg = x.index_select(0, self.group_rows).view(len(self.group_slots), -1, x.shape[1])  # [k, m, in]
        for module in modules:
            slots = self.slots.modules[module]
            a_all, b_all = slots.a[layer][:, :r], slots.b[layer][:, :, :r]  # [S, r, in], [S, out, r]
            cols = y[:, slots.start : slots.end]
            if xg is not None:
                assert self.group_slots is not None and self.picked is not None and self.decode_rows is not None
                # BGMV by adapter: h = x_g A_g^T   [k, m, r];  delta = h B_g^T   [k, m, out]
                h = torch.bmm(xg, a_all.index_select(0, self.group_slots).transpose(1, 2))
                delta = torch.bmm(h, b_all.index_select(0, self.group_slots).transpose(1, 2))
                cols.index_add_(0, self.decode_rows, delta.view(-1, delta.shape[-1]).index_select(0, self.picked))
            for start, end, slot in self.segments:
                # one adapter over a chunk: x [m, in] @ A.T [in, r] @ B.T [r, out]
                cols[start:end].add_((x[start:end] @ a_all[slot].t()) @ b_all[slot].t())
