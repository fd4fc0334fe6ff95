"""Training data for a draft head: the shards datagen.py wrote, packed into batches.

A batch packs whole conversations up to `max_tokens` rows (a longer conversation gets a batch of
its own, cut to `max_tokens`). Rows keep their conversation id and position so the training
forward can mask attention per conversation.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import Tensor


@dataclass(slots=True)
class Conversation:
    token_ids: Tensor  # [n] long
    prompt_len: int
    aux: Tensor  # [n, 3*D] bfloat16: target aux layers' outputs
    last: Tensor  # [n, D] bfloat16: target last layer's output


@dataclass(slots=True)
class Batch:
    token_ids: Tensor  # [T] long
    conv_ids: Tensor  # [T] long: which conversation of the batch a row belongs to
    positions: Tensor  # [T] long: position inside its conversation
    conv_lens: Tensor  # [T] long: length of the row's conversation
    prompt_lens: Tensor  # [T] long
    aux: Tensor  # [T, 3*D] float32
    last: Tensor  # [T, D] float32

    @property
    def num_rows(self) -> int:
        return self.token_ids.shape[0]


def read_conversations(paths: list[Path]) -> list[Conversation]:
    out = []
    for path in paths:
        shard = load_file(str(path))
        offsets = shard["offsets"].tolist()
        for s, (a, b) in enumerate(zip(offsets, offsets[1:])):
            out.append(Conversation(shard["token_ids"][a:b].long(), int(shard["prompt_lens"][s]), shard["aux"][a:b], shard["last"][a:b]))
    return out


def pack(conversations: list[Conversation], max_tokens: int, rng: random.Random | None = None) -> list[list[Conversation]]:
    """Group conversations (shuffled when `rng` is given) into batches of at most `max_tokens` rows."""
    order = list(conversations)
    if rng is not None:
        rng.shuffle(order)
    groups: list[list[Conversation]] = []
    size = 0
    for conv in order:
        n = min(len(conv.token_ids), max_tokens)
        if not groups or size + n > max_tokens:
            groups.append([])
            size = 0
        groups[-1].append(conv)
        size += n
    return groups


def collate(group: list[Conversation], max_tokens: int) -> Batch:
    parts: dict[str, list[Tensor]] = {k: [] for k in ("token_ids", "conv_ids", "positions", "conv_lens", "prompt_lens", "aux", "last")}
    for i, conv in enumerate(group):
        n = min(len(conv.token_ids), max_tokens)
        parts["token_ids"].append(conv.token_ids[:n])
        parts["conv_ids"].append(torch.full((n,), i, dtype=torch.long))
        parts["positions"].append(torch.arange(n))
        parts["conv_lens"].append(torch.full((n,), n, dtype=torch.long))
        parts["prompt_lens"].append(torch.full((n,), conv.prompt_len, dtype=torch.long))
        parts["aux"].append(conv.aux[:n].float())
        parts["last"].append(conv.last[:n].float())
    return Batch(**{k: torch.cat(v) for k, v in parts.items()})


def token_counts(conversations: list[Conversation], vocab_size: int) -> Tensor:
    """How often each token is one the head must draft (answer tokens), [vocab_size] long."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for conv in conversations:
        counts += torch.bincount(conv.token_ids[conv.prompt_len :], minlength=vocab_size)
    return counts


def draft_vocab(counts: Tensor, size: int) -> Tensor:
    """The `size` most frequent tokens (ties by id), sorted by id: draft id i -> target id out[i]."""
    size = min(size, counts.shape[0])
    order = torch.argsort(counts, descending=True, stable=True)[:size]
    return torch.sort(order).values
