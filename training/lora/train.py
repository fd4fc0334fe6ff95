"""Train a LoRA adapter on question/answer pairs and write it as PEFT files: the job behind `edgerun lora train`.

The base model's weights stay frozen in float32; AdamW updates only A and B (PEFT's init: B = 0, so
training starts at the base model). Each step takes a batch of pairs in a fixed shuffled order, with the
cross-entropy on answer tokens only, so the adapter changes how the model answers and not what it reads.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import torch
import torch.nn.functional as F

from engines.builtin.config import EngineConfig
from engines.builtin.loader import load_model
from engines.builtin.runner.model import rms_norm
from engines.builtin.runner.weights import LlamaWeights
from training.lora.export import save_adapter
from training.lora.forward import LoraParams, decoder_layers, embed_prefix
from training.lora.pairs import FRENCH_PAIRS, IGNORE, answer_labels, encode_pair, read_pairs


@dataclass(slots=True)
class LoraTrainConfig:
    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = ("q_proj", "v_proj")
    num_top_layers: int = 10  # adapt the model's last N layers (PEFT's layers_to_transform); the rest stay frozen
    num_steps: int = 200
    batch_size: int = 4
    learning_rate: float = 3e-3
    max_answer_tokens: int = 16
    seed: int = 0
    log_every: int = 0  # print the running loss and write the adapter so far every N steps (0: at the end only)

    def __post_init__(self) -> None:
        if min(self.num_steps, self.batch_size, self.rank, self.num_top_layers) < 1:
            raise ValueError("num_steps, batch_size, rank and num_top_layers must be positive")


class LoraTrainReport(TypedDict):
    out: str
    num_pairs: int
    num_steps: int
    first_loss: float
    last_loss: float
    seconds: float


def train_adapter(out: Path, model: str = "smollm2", config: LoraTrainConfig | None = None,
                  pairs_path: Path = FRENCH_PAIRS) -> LoraTrainReport:
    config = config or LoraTrainConfig()
    started = time.monotonic()
    loaded = load_model(EngineConfig(model=model))
    state = {name: t.float() for name, t in loaded.weights.items()}  # float32 copies, frozen
    weights = LlamaWeights.from_state_dict(state, loaded.config)
    rows = [encode_pair(loaded.tokenizer, q, a, config.max_answer_tokens) for q, a in read_pairs(pairs_path)]
    first = max(0, loaded.config.num_layers - config.num_top_layers)
    layers = range(first, loaded.config.num_layers)
    # the frozen layers below the adapter run once, over every row (right-padded): [R, T, D]
    token_ids = torch.nn.utils.rnn.pad_sequence([torch.tensor(p + a) for p, a in rows], batch_first=True)
    prefixes = embed_prefix(weights, loaded.config, token_ids, first)
    torch.manual_seed(config.seed)
    lora = LoraParams.init(loaded.config, config.rank, config.alpha, config.targets, layers, config.seed)
    optimizer = torch.optim.AdamW(lora.parameters(), lr=config.learning_rate, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 10))
    order = random.Random(config.seed)
    queue: list[int] = []
    losses: list[float] = []
    for step in range(config.num_steps):
        while len(queue) < config.batch_size:  # whole shuffled passes over the rows
            queue += order.sample(range(len(rows)), len(rows))
        picked = [queue.pop() for _ in range(config.batch_size)]
        labels = answer_labels([rows[i] for i in picked])  # [B, T]
        x = prefixes[picked, : labels.shape[1]]  # [B, T, D]
        hidden = decoder_layers(weights, loaded.config, lora, x, layers)
        answer = labels != IGNORE
        normed = rms_norm(hidden[answer], weights.norm, loaded.config.rms_norm_eps)  # [N, D], answer positions only
        loss = F.cross_entropy(F.linear(normed, weights.lm_head), labels[answer])  # type: ignore[arg-type]
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if config.log_every and (step + 1) % config.log_every == 0:
            recent = losses[-config.log_every:]
            print(f"step {step + 1}: loss {sum(recent) / len(recent):.3f} ({time.monotonic() - started:.0f} s)", flush=True)
            save_adapter(out, lora, loaded.config, loaded.name)
    save_adapter(out, lora, loaded.config, loaded.name)
    return LoraTrainReport(out=str(out), num_pairs=len(rows), num_steps=config.num_steps, first_loss=losses[0],
                           last_loss=sum(losses[-10:]) / len(losses[-10:]), seconds=time.monotonic() - started)
