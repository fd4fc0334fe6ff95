"""The two jobs behind `edgerun draft`: train a head for a target, and measure one.

    train_pipeline: self-distillation data (cached in OUT/data, resumable) -> training-time-test
                    training (state in OUT/train_state.pt) -> OUT/config.json + model.safetensors
    eval_pipeline:  greedy answers to the held-out prompts (cached in HEAD/eval_data) -> mean
                    accepted length at k = 1..4

The head directory is what `--speculative-model DIR` loads.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TypedDict

from engines.builtin.config import EngineConfig
from engines.builtin.loader import load_model
from engines.builtin.speculative.eagle3 import load_proposer
from engines.builtin.speculative.eagle3.config import Eagle3Config, default_aux_layers
from training.eagle3.datagen import DataGenConfig, data_engine, generate_data
from training.eagle3.dataset import read_conversations
from training.eagle3.evaluate import acceptance
from training.eagle3.export import save_head
from training.eagle3.prompts import build_prompts, split
from training.eagle3.train import TargetParts, TrainConfig, train_head

DEFAULT_OUT = Path.home() / ".cache" / "edgerun" / "eagle3" / "smollm2"


class TrainReport(TypedDict):
    """train_report.json, and what `edgerun draft train` prints."""

    data_seconds: int
    train_seconds: int
    conversations: int
    tokens: int
    answer_tokens: int
    draft_vocab_size: int
    aux_layers: list[int]
    epochs: int
    ttt_steps: int


class EvalReport(TypedDict):
    """What `edgerun draft eval` prints."""

    head: str
    prompts: int
    mean_accepted_length: dict[str, float]  # "k=1".."k=4" and "positions" (see Acceptance.as_dict)
    ms_per_4_draft_call: float


def train_pipeline(out: Path, model: str, config: TrainConfig, max_tokens: int = 256, num_prompts: int | None = None,
                   num_threads: int | None = None, data_budget_s: float | None = None) -> TrainReport:
    """Generate (or reuse) the data, train, write the head into `out`; returns a report (also in
    train_report.json). `data_budget_s` caps the time spent making new data (see generate_data)."""
    started = time.monotonic()
    engine = data_engine(model, num_threads, max_tokens)
    aux_layers = default_aux_layers(engine.runner.model_config.num_layers)
    prompts, _ = split(build_prompts())
    prompts = prompts[:num_prompts] if num_prompts else prompts
    paths = generate_data(engine, prompts, DataGenConfig(out / "data", aux_layers, max_tokens=max_tokens), data_budget_s)
    del engine  # its KV cache and packed weights are not needed for training
    data_s = time.monotonic() - started
    conversations = read_conversations(paths)
    head = train_head(conversations, target_parts(model), aux_layers, config, out / "train_state.pt")
    save_head(head, out)
    report: TrainReport = {
        "data_seconds": round(data_s), "train_seconds": round(time.monotonic() - started - data_s),
        "conversations": len(conversations), "tokens": sum(len(c.token_ids) for c in conversations),
        "answer_tokens": sum(len(c.token_ids) - c.prompt_len for c in conversations),
        "draft_vocab_size": head.config.draft_vocab_size, "aux_layers": list(aux_layers),
        "epochs": config.num_epochs, "ttt_steps": config.num_ttt_steps,
    }
    (out / "train_report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def eval_pipeline(head_dir: Path, model: str, max_tokens: int = 256, num_threads: int | None = None) -> EvalReport:
    """Mean accepted length of the head in `head_dir` on the held-out prompts (greedy answers)."""
    engine = data_engine(model, num_threads, max_tokens)
    target_config = engine.runner.model_config
    head_config = Eagle3Config.from_hf(json.loads((head_dir / "config.json").read_text()), target_config.num_layers)
    _, held_out = split(build_prompts())
    data = DataGenConfig(head_dir / "eval_data", head_config.aux_layers, max_tokens=max_tokens, temperatures=(0.0,))
    conversations = read_conversations(generate_data(engine, held_out, data))
    proposer = load_proposer(head_dir, target_config, embed=target_parts(model).embed)
    started = time.monotonic()
    result = acceptance(proposer, conversations)
    return {
        "head": str(head_dir), "prompts": len(held_out), "mean_accepted_length": result.as_dict(),
        "ms_per_4_draft_call": round(1000 * (time.monotonic() - started) / max(1, result.num_positions), 2),
    }


def target_parts(model: str) -> TargetParts:
    loaded = load_model(EngineConfig(model=model))
    w = loaded.weights
    return TargetParts(loaded.config, w["embed"].float(), w["norm"].float(), w.get("lm_head", w["embed"]).float())
