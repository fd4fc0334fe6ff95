"""Self-distillation data: the target answers the prompt set, and its hidden states are kept.

Answers come from the project's own engine, kept full across shards (continuous batching), half
greedy and half sampled at a low temperature so the head sees the target's distribution, not one
path. Each
finished conversation is then run once more, teacher-forced (features.py), to capture the aux
layers' outputs and the last layer's output (the target's logits are recomputed from it while
training: far smaller than [T, vocab]).

Shards of `shard_size` conversations are written as safetensors files into `out_dir`:
    token_ids [N] int32, offsets [S+1] int64 (conversation s is rows offsets[s]:offsets[s+1]),
    prompt_lens [S] int32, aux [N, 3*D] bfloat16, last [N, D] bfloat16.
A shard that exists is skipped, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from engines.base import GenerationRequest
from engines.builtin.config import EngineConfig
from engines.builtin.engine.llm_engine import LLMEngine
from engines.sampling_params import SamplingParams
from training.eagle3.features import target_features
from training.eagle3.prompts import Prompt

logger = logging.getLogger(__name__)


@dataclass(slots=True, frozen=True)
class DataGenConfig:
    out_dir: Path
    aux_layers: tuple[int, ...]
    max_tokens: int = 256
    shard_size: int = 32
    temperatures: tuple[float, ...] = (0.0, 0.7)  # each prompt is answered once per temperature
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_tokens < 1 or self.shard_size < 1 or not self.temperatures:
            raise ValueError("max_tokens and shard_size must be >= 1, and temperatures not empty")


def shard_path(out_dir: Path, index: int) -> Path:
    return out_dir / f"shard-{index:05d}.safetensors"


def generate_data(engine: LLMEngine, prompts: list[Prompt], config: DataGenConfig, budget_s: float | None = None) -> list[Path]:
    """Fill `config.out_dir` with shards for `prompts` x temperatures; returns the shards' paths.

    The engine is kept full (continuous batching): the next missing shard's prompts are queued as
    soon as fewer requests than the engine runs at once are unfinished, so a shard's slowest answers
    overlap the next shard's first ones instead of decoding alone. A shard is written (features.py's
    one teacher-forced pass per conversation) as soon as all its answers are in.

    With `budget_s`, no new shard is started after that many seconds: the data is what the cache
    holds plus what was made in time (shards are ordered, so a later run carries on)."""
    config.out_dir.mkdir(parents=True, exist_ok=True)
    jobs = [(p, t) for t in config.temperatures for p in prompts]
    num_shards = -(-len(jobs) // config.shard_size)
    missing = [i for i in range(num_shards) if not shard_path(config.out_dir, i).exists()]
    present = set(range(num_shards)) - set(missing)
    open_shards: dict[int, _OpenShard] = {}
    started, num_tokens = time.monotonic(), 0
    while missing or open_shards:
        unfinished = sum(s.num_unfinished for s in open_shards.values())
        if missing and unfinished < engine.config.max_num_seqs:
            if budget_s is not None and time.monotonic() - started >= budget_s:
                logger.info("eagle3 data: time budget spent; %d of %d shards present", len(present) + len(open_shards), num_shards)
                missing = []  # the open shards are finished, no new one is started
            else:
                index = missing.pop(0)
                first = index * config.shard_size
                batch = jobs[first : first + config.shard_size]
                open_shards[index] = _OpenShard.submit(engine, index, batch, config.max_tokens, config.seed + first)
                continue
        if not open_shards:
            break
        for out in engine.step():
            index, i = (int(part) for part in out.request_id.split(":"))
            shard = open_shards[index]
            shard.answers[i].extend(out.new_token_ids)
            if out.is_finished:
                shard.num_unfinished -= 1
            if shard.num_unfinished == 0:
                num_tokens += write_shard(engine, shard.conversations(), config.aux_layers, shard_path(config.out_dir, index))
                present.add(index)
                del open_shards[index]
                logger.info("eagle3 data: shard %d/%d written (%d tokens this run, %.0f s)",
                            index + 1, num_shards, num_tokens, time.monotonic() - started)
    return [shard_path(config.out_dir, i) for i in sorted(present)]


@dataclass(slots=True)
class _OpenShard:
    """A shard whose prompts are in the engine: its prompt ids and the answers so far."""

    prompt_ids: list[list[int]]
    answers: list[list[int]]
    num_unfinished: int

    @classmethod
    def submit(cls, engine: LLMEngine, index: int, batch: list[tuple[Prompt, float]], max_tokens: int, seed: int) -> _OpenShard:
        prompt_ids = []
        for i, (prompt, temperature) in enumerate(batch):
            text = engine.tokenizer.apply_chat_template(list(prompt.messages), add_generation_prompt=True)
            prompt_ids.append(engine.tokenizer.encode(text))
            sampling = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=0.95 if temperature else 1.0, seed=seed + i)
            engine.add_request(GenerationRequest(f"{index}:{i}", prompt_ids[-1], sampling))
        return cls(prompt_ids, [[] for _ in batch], len(batch))

    def conversations(self) -> list[tuple[list[int], int]]:
        """(prompt + answer token ids, prompt length) per conversation, in the shard's order."""
        return [(p + a, len(p)) for p, a in zip(self.prompt_ids, self.answers)]


def write_shard(engine: LLMEngine, conversations: list[tuple[list[int], int]], aux_layers: tuple[int, ...], path: Path) -> int:
    runner = engine.runner
    aux, last, tokens, offsets, prompt_lens = [], [], [], [0], []
    for token_ids, prompt_len in conversations:
        a, h = target_features(runner.weights, runner.model_config, token_ids, aux_layers)
        aux.append(a.to(torch.bfloat16))
        last.append(h.to(torch.bfloat16))
        tokens.extend(token_ids)
        offsets.append(len(tokens))
        prompt_lens.append(prompt_len)
    tensors = {
        "token_ids": torch.tensor(tokens, dtype=torch.int32),
        "offsets": torch.tensor(offsets, dtype=torch.int64),
        "prompt_lens": torch.tensor(prompt_lens, dtype=torch.int32),
        "aux": torch.cat(aux),
        "last": torch.cat(last),
    }
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp))
    tmp.replace(path)  # a shard is there whole or not at all
    return len(tokens)


def data_engine(model: str, num_threads: int | None, max_tokens: int, max_num_seqs: int = 32) -> LLMEngine:
    return LLMEngine(EngineConfig(model=model, num_threads=num_threads, max_num_seqs=max_num_seqs,
                                  num_kv_blocks=max_num_seqs * (2048 // 16) // 2, max_num_batched_tokens=1024))
