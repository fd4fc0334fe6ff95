"""Self-distillation data: the target answers the prompt set, and its hidden states are kept.

Answers come from the project's own engine (batched, continuous batching), half greedy and half
sampled at a low temperature so the head sees the target's distribution, not one path. Each
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
from engines.builtin.llm_engine import LLMEngine
from engines.builtin.speculative.eagle3.features import target_features
from engines.builtin.speculative.eagle3.prompts import Prompt
from engines.sampling_params import SamplingParams

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

    With `budget_s`, no new shard is started after that many seconds: the data is what the cache
    holds plus what was made in time (shards are ordered, so a later run carries on)."""
    config.out_dir.mkdir(parents=True, exist_ok=True)
    jobs = [(p, t) for t in config.temperatures for p in prompts]
    paths = []
    started, num_tokens = time.monotonic(), 0
    for index, first in enumerate(range(0, len(jobs), config.shard_size)):
        path = shard_path(config.out_dir, index)
        if path.exists():
            paths.append(path)
            continue
        if budget_s is not None and time.monotonic() - started >= budget_s:
            logger.info("eagle3 data: time budget spent; %d of %d shards present", len(paths), -(-len(jobs) // config.shard_size))
            break
        paths.append(path)
        batch = jobs[first : first + config.shard_size]
        conversations = answer(engine, batch, config.max_tokens, config.seed + first)
        num_tokens += write_shard(engine, conversations, config.aux_layers, path)
        logger.info("eagle3 data: shard %d/%d written (%d tokens this run, %.0f s)",
                    index + 1, -(-len(jobs) // config.shard_size), num_tokens, time.monotonic() - started)
    return paths


def answer(engine: LLMEngine, batch: list[tuple[Prompt, float]], max_tokens: int, seed: int) -> list[tuple[list[int], int]]:
    """Run every prompt through the engine at once; returns (prompt + answer token ids, prompt length)."""
    prompt_ids = {}
    for i, (prompt, temperature) in enumerate(batch):
        text = engine.tokenizer.apply_chat_template(list(prompt.messages), add_generation_prompt=True)
        prompt_ids[str(i)] = engine.tokenizer.encode(text)
        sampling = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=0.95 if temperature else 1.0, seed=seed + i)
        engine.add_request(GenerationRequest(str(i), prompt_ids[str(i)], sampling))
    answers: dict[str, list[int]] = {key: [] for key in prompt_ids}
    while engine.has_unfinished:
        for out in engine.step():
            answers[out.request_id].extend(out.new_token_ids)
    return [(prompt_ids[key] + answers[key], len(prompt_ids[key])) for key in prompt_ids]


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
