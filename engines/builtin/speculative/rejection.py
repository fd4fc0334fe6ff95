"""Deciding which drafted tokens the target model accepts: small pure functions.

A verify row ran the sequence's last token followed by k drafts d_1..d_k, so the target gave k + 1
next-token distributions: row j is the target's distribution for the token after d_j (row 0: after
the last committed token). The result is the accepted drafts plus one token of the target's own
(the correction at the first rejection, or a bonus token when every draft was accepted), so each
verify step emits between 1 and k + 1 tokens.

Greedy: a draft is accepted while it equals the target's argmax. Sampled (Leviathan et al. 2023,
Chen et al. 2023): draft d_j drawn from the draft distribution q_j is accepted with probability
min(1, p_j(d_j) / q_j(d_j)); at the first rejection the token is drawn from norm(max(0, p_j - q_j)).
The emitted tokens are then distributed exactly as if drawn from the target one by one. A
deterministic drafter (n-gram lookup, a greedy draft head) has a one-hot q_j at d_j: accept with
probability p_j(d_j), on rejection draw from p_j with d_j removed.
"""

from __future__ import annotations

import torch
from torch import Tensor


def accept_greedy(target_ids: list[int], draft_ids: list[int]) -> list[int]:
    # target_ids: the target's argmax at each of the k + 1 rows; draft_ids: the k drafts
    num_accepted = 0
    while num_accepted < len(draft_ids) and draft_ids[num_accepted] == target_ids[num_accepted]:
        num_accepted += 1
    return draft_ids[:num_accepted] + [target_ids[num_accepted]]


def residual_distribution(p: Tensor, q: Tensor) -> Tensor:
    # p, q: [V] target and draft probabilities at the rejected row -> norm(max(0, p - q))   [V]
    residual = (p - q).clamp_min_(0.0)
    total = residual.sum()
    return residual / total if total > 0 else p  # total == 0 only when p == q, where nothing is rejected


def accept_sampled(p: Tensor, draft_ids: list[int], q: Tensor | None, generator: torch.Generator | None) -> list[int]:
    # p: [k + 1, V] target probabilities (temperature, top-k/top-p and penalties applied);
    # q: [k, V] draft probabilities, None for a deterministic drafter (one-hot at each draft)
    k = len(draft_ids)
    drafts = torch.tensor(draft_ids, dtype=torch.long, device=p.device)
    rows = torch.arange(k, device=p.device)
    if q is None:
        q = torch.zeros(k, p.shape[-1], dtype=p.dtype, device=p.device)
        q[rows, drafts] = 1.0
    p_draft, q_draft = p[rows, drafts], q[rows, drafts]  # [k]
    u = torch.rand(k, generator=generator, device=p.device)
    accepted = (u * q_draft < p_draft).tolist()  # u < p/q: accept with probability min(1, p/q)
    num_accepted = accepted.index(False) if False in accepted else k
    if num_accepted == k:
        last = p[k]  # every draft accepted: a bonus token from the target's next distribution
    else:
        last = residual_distribution(p[num_accepted], q[num_accepted])
    token = torch.multinomial(last, 1, generator=generator).item()
    return draft_ids[:num_accepted] + [int(token)]
