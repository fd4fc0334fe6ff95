"""Training-time test: the head's unrolled forward over a packed batch, and its loss.

EAGLE-3 trains the head on the inputs it will see when drafting: step 0 reads the target's hidden
states; step j >= 1 reads the head's own output of step j-1 at the same row, with the next true
token. Row t (position p in its conversation) at step j sits at position p + j and drafts token
p + 2 + j. It attends to the step-0 keys of its conversation at positions <= p (the committed
context) and to its own keys of steps 1..j (the drafts before it), exactly what the proposer's
cache holds at inference.

Loss at step j: cross-entropy from the target's distribution at position p + 1 + j (renormalised
over the draft vocabulary) to the head's, over rows whose predicted token is an answer token, plus
`feature_weight` x the mean squared distance between the head's output and the target's last
hidden state there, both RMS-normalised. The head's norm and lm_head start as the target's, so
that state is what the head should produce; on a few hundred conversations this dense signal
trains far faster than the softmax alone (EAGLE-1 regressed features; EAGLE-3 dropped it at scale).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from engines.builtin.speculative.eagle3.model import Eagle3Head
from training.eagle3.dataset import Batch


@dataclass(slots=True)
class StepStats:
    loss: float
    accuracy: float  # head's argmax == target's argmax
    num_rows: int


def target_probs(batch: Batch, norm_weight: Tensor, draft_lm_head: Tensor, eps: float) -> Tensor:
    # target's last-layer output [T, D] -> its distribution over the draft vocabulary [T, Vd]
    with torch.no_grad():
        logits = F.linear(F.rms_norm(batch.last, norm_weight.shape, norm_weight, eps), draft_lm_head)
        return logits.softmax(-1)


def unrolled_loss(head: Eagle3Head, batch: Batch, probs: Tensor, num_steps: int, decay: float = 0.8,
                  feature_weight: float = 1.0) -> tuple[Tensor, list[StepStats]]:
    """Sum over steps of decay^j * loss_j, and per-step stats. probs [T, Vd] from `target_probs`."""
    c = head.config
    t_rows = batch.num_rows
    rows = torch.arange(t_rows)
    scale = 1.0 / math.sqrt(c.head_dim)
    group = c.num_heads // c.num_kv_heads
    # step-0 visibility: same conversation, key row <= query row (rows of a conversation are consecutive)
    visible = (batch.conv_ids[:, None] == batch.conv_ids[None, :]) & (rows[None, :] <= rows[:, None])  # [T, T]
    hidden = head.fc(batch.aux)  # [T, D]
    k0 = v0 = None
    diag_k: list[Tensor] = []  # steps >= 1: [T, H, hd] each (kv heads repeated)
    diag_v: list[Tensor] = []
    total = torch.zeros(())
    stats = []
    for j in range(num_steps):
        src = batch.positions + 1 + j  # position of the input token in its conversation
        in_conv = src < batch.conv_lens
        token_rows = torch.where(in_conv, rows + 1 + j, rows).clamp(max=t_rows - 1)
        x = head.layer_input(batch.token_ids[token_rows], hidden)
        q, k, v = head.qkv(x, batch.positions + j)  # q [T, H, hd], k/v [T, KH, hd]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        if j == 0:
            k0, v0 = k, v
        else:
            diag_k.append(k)
            diag_v.append(v)
        scores = torch.einsum("thd,shd->hts", q, k0) * scale  # [H, T, T]
        scores = scores.masked_fill(~visible, float("-inf"))
        diag = [torch.einsum("thd,thd->ht", q, dk)[..., None] * scale for dk in diag_k]  # [H, T, 1] each
        weights = torch.cat([scores, *diag], dim=-1).softmax(-1)
        out = torch.einsum("hts,shd->thd", weights[..., :t_rows], v0)
        for i, dv in enumerate(diag_v):
            out = out + weights[..., t_rows + i].transpose(0, 1)[..., None] * dv
        hidden = head.after_attention(hidden, out.reshape(t_rows, -1))
        # the token drafted here is at position p + 2 + j; the target's distribution for it sits at row t + 1 + j
        predicted = batch.positions + 2 + j
        valid = (predicted < batch.conv_lens) & (predicted >= batch.prompt_lens)
        idx = valid.nonzero().squeeze(-1)
        if idx.numel() == 0:
            continue
        log_q = head.logits(hidden[idx]).log_softmax(-1)
        p = probs[idx + 1 + j]
        loss = -(p * log_q).sum(-1).mean()
        if feature_weight:
            out, want = F.rms_norm(hidden[idx], (c.hidden_size,)), F.rms_norm(batch.last[idx + 1 + j], (c.hidden_size,))
            loss = loss + feature_weight * (out - want).pow(2).mean()
        total = total + decay**j * loss
        accuracy = (log_q.argmax(-1) == p.argmax(-1)).float().mean()
        stats.append(StepStats(loss.item(), accuracy.item(), int(idx.numel())))
    return total, stats
