"""Train a draft head on self-distillation shards: `train_head(conversations, target, config)`.

The head starts from the target where it can: `lm_head` from the target's output rows of the
draft vocabulary and `norm` from its final norm, so step 0 already speaks the target's language;
`fc` and the decoder layer start random. AdamW with linear warm-up and cosine decay; progress is
logged, and a resumable state (head, optimiser, step) is saved every `save_every` steps.
"""

from __future__ import annotations

import logging
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from engines.builtin.runner.model_config import ModelConfig
from engines.builtin.speculative.eagle3.config import Eagle3Config
from engines.builtin.speculative.eagle3.model import Eagle3Head
from training.eagle3.dataset import Conversation, collate, draft_vocab, pack, token_counts
from training.eagle3.export import set_vocab
from training.eagle3.ttt import target_probs, unrolled_loss

logger = logging.getLogger(__name__)


@dataclass(slots=True, frozen=True)
class TrainConfig:
    draft_vocab_size: int = 4096
    num_epochs: int = 2
    batch_tokens: int = 1024
    num_ttt_steps: int = 3
    lr: float = 1e-3
    warmup_steps: int = 20
    seed: int = 0
    save_every: int = 50

    def __post_init__(self) -> None:
        if self.num_epochs < 1 or self.batch_tokens < 8 or self.num_ttt_steps < 1 or self.lr <= 0:
            raise ValueError("num_epochs, num_ttt_steps >= 1, batch_tokens >= 8 and lr > 0 are required")


@dataclass(slots=True)
class TargetParts:
    """What training reads from the target: its shape, embedding, final norm and output matrix."""

    config: ModelConfig
    embed: Tensor  # [V, D]
    norm: Tensor  # [D]
    lm_head: Tensor  # [V, D]


def new_head(target: TargetParts, aux_layers: tuple[int, ...], vocab: Tensor, seed: int, aux_rms: float = 1.0) -> Eagle3Head:
    """A head whose lm_head and norm are the target's; `aux_rms` (the target hidden states' RMS)
    scales fc so the fused state starts at RMS ~1, like the attention and MLP branches added to it:
    left at the default scale (RMS ~30 for SmolLM2) it drowns the token embedding's path."""
    torch.manual_seed(seed)
    t = target.config
    config = Eagle3Config(
        hidden_size=t.hidden_size, num_heads=t.num_heads, num_kv_heads=t.num_kv_heads, head_dim=t.head_dim,
        intermediate_size=t.intermediate_size, vocab_size=t.vocab_size, draft_vocab_size=len(vocab),
        aux_layers=aux_layers, rms_norm_eps=t.rms_norm_eps, rope_theta=t.rope_theta,
        max_position_embeddings=t.max_position_embeddings,
    )
    head = Eagle3Head(config, target.embed)
    set_vocab(head, vocab)
    with torch.no_grad():
        head.fc.weight.normal_(0.0, 1.0 / (math.sqrt(config.fc_in_features) * aux_rms))
        head.lm_head.weight.copy_(target.lm_head[vocab])
        head.norm.weight.copy_(target.norm)
    return head


def initial_head(conversations: list[Conversation], target: TargetParts, aux_layers: tuple[int, ...], config: TrainConfig) -> Eagle3Head:
    """The untrained head for this data: its draft vocabulary and fc scale come from it."""
    vocab = draft_vocab(token_counts(conversations, target.config.vocab_size), config.draft_vocab_size)
    aux_rms = float(torch.cat([c.aux[:64].float() for c in conversations[:32]]).pow(2).mean().sqrt())
    return new_head(target, aux_layers, vocab, config.seed, aux_rms)


def lr_at(step: int, total: int, config: TrainConfig) -> float:
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, total - config.warmup_steps)
    return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train_head(conversations: list[Conversation], target: TargetParts, aux_layers: tuple[int, ...],
               config: TrainConfig, state_path: Path | None = None) -> Eagle3Head:
    head = initial_head(conversations, target, aux_layers, config)
    vocab = head.to_target(torch.arange(head.config.draft_vocab_size))
    optimizer = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=config.lr, weight_decay=0.0)
    rng = random.Random(config.seed)
    epochs = [pack(conversations, config.batch_tokens, rng) for _ in range(config.num_epochs)]
    schedule = [group for epoch in epochs for group in epoch]
    start_step = may_resume(head, optimizer, state_path)
    draft_rows = target.lm_head[vocab]  # [Vd, D]
    started = time.monotonic()
    head.train()
    for step in range(start_step, len(schedule)):
        batch = collate(schedule[step], config.batch_tokens)
        probs = target_probs(batch, target.norm, draft_rows, target.config.rms_norm_eps)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, len(schedule), config)
        loss, stats = unrolled_loss(head, batch, probs, config.num_ttt_steps)
        optimizer.zero_grad(set_to_none=True)
        torch.autograd.backward(loss)  # loss.backward(), which torch leaves unannotated
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        optimizer.step()
        if step % 10 == 0 or step == len(schedule) - 1:
            accs = " ".join(f"{s.accuracy:.2f}" for s in stats)
            logger.info(
                "eagle3 train: step %d/%d loss %.3f acc@step %s (%.0f s)",
                step + 1, len(schedule), loss.item(), accs, time.monotonic() - started,
            )
        if state_path is not None and (step + 1) % config.save_every == 0:
            save_state(head, optimizer, step + 1, state_path)
    head.eval()
    return head


def save_state(head: Eagle3Head, optimizer: torch.optim.Optimizer, step: int, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"head": head.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, tmp)
    tmp.replace(path)


def may_resume(head: Eagle3Head, optimizer: torch.optim.Optimizer, path: Path | None) -> int:
    if path is None or not path.exists():
        return 0
    state = torch.load(path, weights_only=True)
    if state["head"]["d2t"].shape != head.d2t.shape or not torch.equal(state["head"]["d2t"], head.d2t):
        logger.warning("eagle3 train: %s was made with another draft vocabulary; starting over", path)
        return 0
    head.load_state_dict(state["head"])
    optimizer.load_state_dict(state["optimizer"])
    logger.info("eagle3 train: resuming at step %d from %s", state["step"], path)
    return int(state["step"])
