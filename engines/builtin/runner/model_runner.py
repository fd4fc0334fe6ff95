"""Turns a batch of sequences' new tokens into one forward pass over the paged KV cache.

The model runner knows nothing of scheduling: the caller says, per sequence, which tokens to run,
at which position, and which KV blocks hold it. It packs all tokens into one flat batch for the
matmuls, writes their k/v into the cache and returns the logits of each item's last token (of its
last `num_logits` tokens for a speculative verify row: the last committed token plus its drafts, run
like a prefill chunk, causal within the row).
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from engines.builtin.config import EngineConfig
from engines.builtin.loader import cache, load_model
from engines.builtin.runner.attention import (
    AttentionMetadata,
    DecodeGroup,
    PagedDecodes,
    PrefillChunk,
    allocate_kv_caches,
    attention_backends,
)
from engines.builtin.runner.fused_decode import FusedDecode
from engines.builtin.runner.lora import LoraBatch, LoraSlots
from engines.builtin.runner.model import forward, rope_freqs_cis, rope_inv_freq
from engines.builtin.runner.model_config import ModelConfig
from engines.builtin.runner.step_split import StepWorkers, plan_parts
from engines.builtin.runner.thread_choice import ThreadChoices
from engines.builtin.runner.weights import LlamaWeights
from engines.builtin.text.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

# A decode joins the current attention group (contexts ascending) while padding the group's rows to
# its context adds at most this many keys; past that it starts a group of its own. One more SDPA call
# per layer costs about what attending a few hundred padded keys does on a CPU core.
MAX_GROUP_PADDING = 256


@dataclass(slots=True)
class ForwardItem:
    token_ids: list[int]  # new tokens to run now: a prefill chunk, or 1 decode token
    start_pos: int  # absolute position of token_ids[0]; KV of positions < start_pos is already in the cache
    block_table: list[int]  # physical KV block ids covering positions [0, start_pos + len(token_ids))
    num_logits: int = 1  # logits of the last num_logits tokens (1 + k to verify k drafted tokens)
    lora_slot: int | None = None  # the resident adapter it runs under (runner.lora_slots), None: the base model

    def __post_init__(self) -> None:
        if not self.token_ids:
            raise ValueError("every ForwardItem needs at least one token")
        if not 1 <= self.num_logits <= len(self.token_ids):
            raise ValueError(f"num_logits={self.num_logits} must be in [1, {len(self.token_ids)}]")

    @property
    def is_verify(self) -> bool:
        """A speculative verify row: a few tokens after a cached prefix, logits at every one."""
        return 1 < len(self.token_ids) == self.num_logits and self.start_pos > 0


@dataclass(slots=True)
class RunOutput:
    logits: Tensor  # [sum of num_logits, V] float32, items in order, each item's rows in position order
    hidden: list[Tensor] | None  # per item [len(token_ids), len(aux_layers) * D]; None without aux_layers


@dataclass(slots=True)
class PreparedBatch:
    token_ids: Tensor  # [T] packed: decodes first, then prefill chunks
    positions: Tensor  # [T]
    logit_indices: Tensor  # [sum of num_logits] rows of each item's logit tokens, in item order
    item_rows: list[tuple[int, int]]  # packed rows [start, end) of each item's tokens
    meta: AttentionMetadata


def merge_outputs(parts: list[list[int]], outputs: list[RunOutput], num_logits: list[int]) -> RunOutput:
    # each part's output holds its items' rows in part order -> every item's rows in item order
    logits: dict[int, Tensor] = {}
    hidden: dict[int, Tensor] = {}
    for part, output in zip(parts, outputs):
        start = 0
        for i in part:
            logits[i] = output.logits[start : start + num_logits[i]]
            start += num_logits[i]
        if output.hidden is not None:
            hidden.update(zip(part, output.hidden))
    items = range(len(num_logits))
    return RunOutput(torch.cat([logits[i] for i in items]), [hidden[i] for i in items] if hidden else None)


def resolve_device(name: str) -> torch.device:
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device={name!r} but torch sees no CUDA device; use device='cpu'")
    return device


class ModelRunner:
    """Owns the weights, the tokenizer and the KV cache of one model on one device.

    `execute(items)` runs one step for any mix of prefill chunks and decodes and returns float32
    logits [len(items), vocab] of each item's last token (more rows for items with num_logits > 1).
    `run(items, aux_layers)` also returns the residual stream after those decoder layers.
    """

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        if config.num_threads is not None:
            torch.set_num_threads(config.num_threads)  # process-wide: torch has no per-module setting
        self.device = resolve_device(config.device)
        self.dtype = getattr(torch, config.dtype)
        self.block_size = config.block_size
        loaded = load_model(config)
        self.model_name: str = loaded.name
        self.model_config: ModelConfig = loaded.config
        self.tokenizer: Tokenizer = loaded.tokenizer
        state = {name: t.to(device=self.device, dtype=self.dtype) for name, t in loaded.weights.items()}
        self.weights = LlamaWeights.from_state_dict(state, self.model_config)
        if config.linear_format is not None:
            self.pack_weights(config.linear_format, loaded.cache_entry)
        mc = self.model_config
        self.kv_caches = allocate_kv_caches(
            mc.num_layers, config.num_kv_blocks, config.block_size, mc.num_kv_heads, mc.head_dim, self.dtype, self.device
        )
        self.inv_freq = rope_inv_freq(mc, self.device)
        # a step of a few decodes and verify rows in one C++ call where the weights are in the q4_1 format
        self.fused: FusedDecode | None = None
        if config.linear_format == "q4_1":
            self.fused = FusedDecode.may_build(self.weights, mc, self.kv_caches, self.inv_freq)
        # where the fused step runs this model (edgerun's kernels, a float32 CPU cache: the fast mode), the torch
        # path's decode rows attend through edgerun's paged_decode_attention instead of gathered blocks and SDPA
        self.paged_decode = self.fused is not None and hasattr(torch.ops.edgerun, "paged_decode_attention")
        # 1 or all threads per fused step, by the times of steps of its size
        self.fused_threads = ThreadChoices(torch.get_num_threads(), FusedDecode.MAX_ROWS)
        self.max_model_len = min(config.max_model_len or mc.max_position_embeddings, mc.max_position_embeddings)
        num_workers = config.step_workers if config.step_workers is not None else torch.get_num_threads()
        self.step_workers = StepWorkers(num_workers) if self.device.type == "cpu" and num_workers > 1 else None
        # resident LoRA adapters' weights; which adapter holds which slot is the engine's (engine/adapters.py)
        self.lora_slots = LoraSlots(mc, config.max_loras, self.device, self.dtype)

    def close(self) -> None:
        """Stop the step workers, if they run (the next split step starts them again)."""
        if self.step_workers is not None:
            self.step_workers.close()

    def pack_weights(self, linear_format: str, cache_entry: Path | None) -> None:
        # the 4-bit weights of a cached model are found and packed once, then read from its entry
        entry = cache_entry if linear_format in ("int4", "q4_1") else None
        derived = cache.read_derived(entry, linear_format) if entry is not None else None
        built = self.weights.pack(linear_format, derived)
        if entry is not None and derived is None:
            try:
                cache.write_derived(entry, linear_format, built)
            except OSError as exc:  # a read-only cache: later starts pack again
                logger.warning("could not store the packed 4-bit weights in %s: %s", cache_entry, exc)

    def execute(self, items: list[ForwardItem]) -> Tensor:
        """Run the new tokens of every item; return logits [sum of num_logits, vocab] float32."""
        return self.run(items).logits

    def run(self, items: list[ForwardItem], aux_layers: tuple[int, ...] = (), may_split: bool = True) -> RunOutput:
        """`execute`, plus the outputs of decoder layers `aux_layers` (0-based) at every new token.

        Every step takes one of three paths, chosen here and nowhere else:
            split    on the CPU with step workers, a step whose items divide into parts of about equal size
                     (step_split.plan_parts) runs its parts at once on one-thread workers; each part then
                     takes one of the two paths below for itself (`may_split=False`)
            fused    a step of a few decodes and verify rows over weights in the q4_1 format, each under its
                     adapter, if any: one call of edgerun's C++ decode step (fused_decode.py), on 1 or all
                     threads (thread_choice.py)
            forward  everything else: model.py's forward pass over the batch `prepare_batch` packs, each row
                     under its adapter, if any (lora.py)
        """
        parts = self.split_parts(items) if may_split else None
        if parts is not None:
            return self.run_split(parts, items, aux_layers)
        fused = self.fused_for(items)
        if fused is not None:
            return self.run_fused(fused, items, aux_layers)
        return self.run_forward(items, aux_layers)

    def split_parts(self, items: list[ForwardItem]) -> list[list[int]] | None:
        """The items' indices by part when this step runs split (step_split.py), else None."""
        workers = self.step_workers
        return None if workers is None else plan_parts([len(item.token_ids) for item in items], workers.num_workers)

    def run_split(self, parts: list[list[int]], items: list[ForwardItem], aux_layers: tuple[int, ...]) -> RunOutput:
        assert self.step_workers is not None, "split_parts plans parts only where step workers exist"

        def run_part(part: list[int]) -> RunOutput:
            return self.run([items[i] for i in part], aux_layers, may_split=False)

        return merge_outputs(parts, self.step_workers.map(run_part, parts), [item.num_logits for item in items])

    def run_forward(self, items: list[ForwardItem], aux_layers: tuple[int, ...]) -> RunOutput:
        """`run` as model.py's forward pass on the calling thread."""
        with torch.inference_mode(), attention_backends(self.device):
            batch = self.prepare_batch(items)
            freqs_cis = rope_freqs_cis(batch.positions, self.inv_freq)
            rows = [(start, end, item.lora_slot) for (start, end), item in zip(batch.item_rows, items)]
            lora = LoraBatch.prepare(self.lora_slots, rows, self.device)
            logits, aux = forward(self.weights, self.model_config, self.kv_caches, batch.token_ids, freqs_cis,
                                  batch.meta, batch.logit_indices, aux_layers, lora)
        hidden = None if aux is None else [aux[start:end] for start, end in batch.item_rows]
        return RunOutput(logits, hidden)

    def fused_for(self, items: list[ForwardItem]) -> FusedDecode | None:
        """The fused step if this step runs through it (decodes and verify rows only, few enough tokens), else None."""
        fused = self.fused
        if fused is None or not all(len(item.token_ids) == 1 or item.is_verify for item in items):
            return None
        if self.lora_slots.dtype != torch.float32 and any(item.lora_slot is not None for item in items):
            return None
        return fused if fused.can_run([len(item.token_ids) for item in items]) else None

    def run_fused(self, fused: FusedDecode, items: list[ForwardItem], aux_layers: tuple[int, ...]) -> RunOutput:
        """`run` for a step of decodes and verify rows, in one call of the fused kernel, on 1 or all of this
        thread's torch threads, whichever has been faster lately (thread_choice.py). A verify row's tokens are
        rows of their own there, at consecutive positions over the item's block table (causal: fused_decode.py);
        every row has logits, so they come back in RunOutput's order as they are."""
        token_ids: list[int] = []
        positions: list[int] = []
        tables: list[list[int]] = []
        row_slots: list[int | None] = []
        for item in items:
            self.check_item(item)
            token_ids += item.token_ids
            positions += range(item.start_pos, item.start_pos + len(item.token_ids))
            tables += [item.block_table] * len(item.token_ids)
            row_slots += [item.lora_slot] * len(item.token_ids)
        lora = self.lora_slots.fused(row_slots)
        max_threads = torch.get_num_threads()  # 1 on a step worker (step_split.py): it leaves the choice alone
        if max_threads > 1 and self.fused_threads.max_threads != max_threads:
            self.fused_threads = ThreadChoices(max_threads, FusedDecode.MAX_ROWS)
        num_threads = self.fused_threads.pick(len(token_ids)) if max_threads > 1 else 1
        start = time.perf_counter()
        with torch.inference_mode():
            logits, aux = fused(token_ids, positions, tables, aux_layers, num_threads, lora)
        if max_threads > 1:
            self.fused_threads.record(num_threads, 1000 * (time.perf_counter() - start), len(token_ids))
        if aux is None:
            return RunOutput(logits, None)
        ends = list(itertools.accumulate(len(item.token_ids) for item in items))
        return RunOutput(logits, [aux[end - len(item.token_ids) : end] for item, end in zip(items, ends)])

    def prepare_batch(self, items: list[ForwardItem]) -> PreparedBatch:
        if not items:
            raise ValueError("execute() needs at least one item")
        bs = self.block_size
        # verify rows run as chunks; decodes go shortest context first, so similar ones share an attention group
        decodes = sorted((i for i, item in enumerate(items) if len(item.token_ids) == 1), key=lambda i: items[i].start_pos)
        prefills = [i for i, item in enumerate(items) if len(item.token_ids) > 1]
        if len(decodes) + len(prefills) != len(items):
            raise ValueError("every ForwardItem needs at least one token")
        token_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        logit_rows: list[list[int]] = [[] for _ in items]
        item_rows = [(0, 0)] * len(items)
        for row, i in enumerate(decodes):
            item = items[i]
            self.check_item(item)
            pos = item.start_pos
            token_ids.append(item.token_ids[0])
            positions.append(pos)
            slots.append(item.block_table[pos // bs] * bs + pos % bs)
            logit_rows[i] = [row]
            item_rows[i] = (row, row + 1)
        paged = self.prepare_paged_decodes([items[i] for i in decodes]) if self.paged_decode and decodes else None
        decode_groups = [] if paged is not None else self.prepare_decode_groups([items[i] for i in decodes])
        chunks = []
        row = len(decodes)
        for i in prefills:
            item = items[i]
            self.check_item(item)
            n, start = len(item.token_ids), item.start_pos
            table = item.block_table
            token_ids.extend(item.token_ids)
            positions.extend(range(start, start + n))
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, start + n))
            chunks.append(self.prepare_prefill_chunk(row, item))
            logit_rows[i] = list(range(row + n - item.num_logits, row + n))
            item_rows[i] = (row, row + n)
            row += n
        meta = AttentionMetadata(
            slot_mapping=self.to_tensor(slots),
            num_decodes=len(decodes),
            decode_groups=decode_groups,
            prefills=chunks,
            paged_decodes=paged,
        )
        logit_indices = self.to_tensor([r for rows in logit_rows for r in rows])
        return PreparedBatch(self.to_tensor(token_ids), self.to_tensor(positions), logit_indices, item_rows, meta)

    def prepare_paged_decodes(self, items: list[ForwardItem]) -> PagedDecodes:
        # the decodes in row order -> their context lengths and block tables, padded with block 0 to the longest
        context = [item.start_pos + 1 for item in items]
        width = -(-max(context) // self.block_size)
        tables = [item.block_table[:width] + [0] * (width - len(item.block_table[:width])) for item in items]
        return PagedDecodes(self.to_tensor(context), self.to_tensor(tables))

    def prepare_decode_groups(self, items: list[ForwardItem]) -> list[DecodeGroup]:
        # items: the decodes in row order, shortest context first -> groups of consecutive rows
        groups: list[DecodeGroup] = []
        start = 0
        for end in range(1, len(items) + 1):
            if end < len(items):
                longest, following = items[end - 1].start_pos + 1, items[end].start_pos + 1
                if (end - start) * (following - longest) <= MAX_GROUP_PADDING:
                    continue
            groups.append(self.prepare_decode_group(start, items[start:end]))
            start = end
        return groups

    def prepare_decode_group(self, start: int, items: list[ForwardItem]) -> DecodeGroup:
        # -> block tables [B, max_blocks] (padded with block 0), the longest context, mask [B, 1, 1, L] or None
        context = [item.start_pos + 1 for item in items]
        longest = max(context)
        num_blocks = math.ceil(longest / self.block_size)
        end = start + len(items)
        if len(items) == 1:
            return DecodeGroup(start, end, self.prepare_blocks(items[0].block_table[:num_blocks]), longest, None)
        tables = [item.block_table[:num_blocks] + [0] * (num_blocks - len(item.block_table[:num_blocks])) for item in items]
        mask = None
        if min(context) != longest:
            mask = (torch.arange(longest) < torch.tensor(context)[:, None])[:, None, None, :].to(self.device)
        return DecodeGroup(start, end, self.to_tensor(tables), longest, mask)

    def prepare_blocks(self, table: list[int]) -> Tensor | slice:
        # one sequence's blocks: a slice when they are a contiguous run (read as a view, no gather)
        first = table[0]
        if table[-1] - first == len(table) - 1 and table == list(range(first, first + len(table))):
            return slice(first, first + len(table))
        return self.to_tensor(table)

    def prepare_prefill_chunk(self, row: int, item: ForwardItem) -> PrefillChunk:
        n, start = len(item.token_ids), item.start_pos
        context = start + n
        num_blocks = math.ceil(context / self.block_size)
        mask = None  # a chunk that starts the sequence is plain causal
        if start:  # token t (position start + t) sees keys at positions <= start + t
            mask = (torch.arange(context)[None, :] <= torch.arange(start, context)[:, None]).to(self.device)  # [n, ctx]
        return PrefillChunk(row, row + n, self.prepare_blocks(item.block_table[:num_blocks]), context, mask)

    def check_item(self, item: ForwardItem) -> None:
        end = item.start_pos + len(item.token_ids)
        if item.start_pos < 0 or len(item.block_table) * self.block_size < end:
            raise ValueError(f"block_table of {len(item.block_table)} blocks cannot hold positions [0, {end})")
        if end > self.max_model_len:
            raise ValueError(f"position {end - 1} is past max_model_len={self.max_model_len}")

    def to_tensor(self, values: list[int] | list[list[int]]) -> Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)
