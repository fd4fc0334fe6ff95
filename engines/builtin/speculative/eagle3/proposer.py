"""Chain drafts from an EAGLE-3 head, with the head's own KV cache per sequence.

Per sequence the head keeps k/v of the committed positions it has been given hidden states for
(position p pairs the target's hidden state at p with the token at p+1). Each `propose` call:

1. takes the new hidden rows (from `hidden_start`; state beyond it is dropped first), computes
   their k/v, and runs the full layer only for the newest row, whose output drafts token n+1;
2. chains: the output and the drafted token go in again at the next position, attending to the
   committed cache plus the drafts so far (those k/v are temporary: the next call brings the
   target's own hidden states for whatever was accepted).

Positions the engine never ran (prefix-cache hits) have no hidden states: the cache then starts at
the first position it is given, and the head drafts without that prefix (correctness is unaffected).

Tree drafts are not built: on a CPU the target's verify cost grows with every drafted token, so
one chain of the head's best guesses is the cheaper bet (see BENCHMARKS.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engines.builtin.runner.attention import attention_backends
from engines.builtin.runner.linear import Fp16Linear
from engines.builtin.speculative.eagle3.model import Eagle3Head
from engines.builtin.speculative.proposer import DraftInput


@dataclass(slots=True)
class HeadCache:
    start: int  # position of keys[0]
    keys: Tensor  # [n, KH, hd], rotated
    values: Tensor  # [n, KH, hd]
    last_out: Tensor | None = None  # [1, D] the head's output at the newest position

    @property
    def end(self) -> int:
        return self.start + self.keys.shape[0]


class PackedLinear(nn.Module):
    """An nn.Linear's weight held as float16 for fbgemm (see weights.Fp16Linear): a draft step at
    batch 1 reads every head weight once, so it runs at memory bandwidth like the target's decode."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.packed = Fp16Linear.from_weight(linear.weight.detach())

    def forward(self, x: Tensor) -> Tensor:
        return self.packed(x)


def pack_fp16(head: Eagle3Head) -> None:
    """Replace every linear layer of `head` (CPU, float32) by its float16-packed twin, in place."""
    for module in list(head.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, PackedLinear(child))


class Eagle3Proposer:
    """A `Proposer` over one head; `aux_layers` are the target layers the engine must capture.

    `fp16_weights` packs the head's linear layers as float16 (CPU float32 heads only)."""

    def __init__(self, head: Eagle3Head, fp16_weights: bool = False) -> None:
        self.head = head.eval()
        self.aux_layers = tuple(head.config.aux_layers)
        self.caches: dict[str, HeadCache] = {}
        p = head.norm.weight
        self.device, self.dtype = p.device, p.dtype
        if fp16_weights:
            pack_fp16(head)

    def propose(self, inputs: list[DraftInput]) -> list[list[int]]:
        with torch.inference_mode(), attention_backends(self.device):
            return [self.propose_one(item) for item in inputs]

    def finish(self, seq_id: str) -> None:
        self.caches.pop(seq_id, None)

    def propose_one(self, item: DraftInput) -> list[int]:
        cache = self.may_ingest(item)
        if cache is None or cache.last_out is None or item.num_drafts <= 0:
            return []
        if cache.end != len(item.token_ids) - 1:
            return []  # hidden states stop short of the newest token: nothing sound to draft from
        return self.chain(cache, cache.last_out, item.num_drafts)

    def may_ingest(self, item: DraftInput) -> HeadCache | None:
        cache = self.caches.get(item.seq_id)
        if item.hidden is None or item.hidden.shape[0] == 0:
            return cache
        start, num_new = item.hidden_start, item.hidden.shape[0]
        c = self.head.config
        if cache is None or not cache.start <= start <= cache.end:
            empty = torch.empty(0, c.num_kv_heads, c.head_dim, device=self.device, dtype=self.dtype)
            cache = HeadCache(start, empty, empty)
        elif start < cache.end:  # rewind: drop what lies at or beyond `start`
            keep = start - cache.start
            cache.keys, cache.values = cache.keys[:keep], cache.values[:keep]
        self.caches[item.seq_id] = cache
        # position p pairs hidden[p] with token p+1; a row whose next token is not known yet is dropped
        num_new = min(num_new, len(item.token_ids) - 1 - start)
        if num_new <= 0:
            return cache
        tokens = torch.tensor(item.token_ids[start + 1 : start + num_new + 1], dtype=torch.long, device=self.device)
        fused = self.head.fc(item.hidden[:num_new].to(device=self.device, dtype=self.dtype))  # [n, D]
        x = self.head.layer_input(tokens, fused)
        positions = torch.arange(start, start + num_new, device=self.device)
        q, k, v = self.head.qkv(x, positions)
        cache.keys = torch.cat([cache.keys, k])
        cache.values = torch.cat([cache.values, v])
        attn = self.attend(q[-1:], cache.keys, cache.values)  # only the newest row drafts
        cache.last_out = self.head.after_attention(fused[-1:], attn)
        return cache

    def chain(self, cache: HeadCache, out: Tensor, num_drafts: int) -> list[int]:
        drafts: list[int] = []
        keys, values = cache.keys, cache.values
        for step in range(num_drafts):
            token = self.head.to_target(self.head.logits(out).argmax(-1))  # [1]
            drafts.append(int(token))
            if step == num_drafts - 1:
                break
            position = torch.tensor([cache.end + step], device=self.device)
            q, k, v = self.head.qkv(self.head.layer_input(token, out), position)
            keys, values = torch.cat([keys, k]), torch.cat([values, v])
            out = self.head.after_attention(out, self.attend(q, keys, values))
        return drafts

    def attend(self, q: Tensor, keys: Tensor, values: Tensor) -> Tensor:
        # q [1, H, hd] over keys/values [n, KH, hd] (all visible) -> [1, H*hd]
        out = F.scaled_dot_product_attention(q.transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1), enable_gqa=True)
        return out.transpose(0, 1).reshape(1, -1)
