"""How fast `edgerun draft train` makes its self-distillation data (answers + hidden states).

    python -m benchmarks.speculative.eagle3_datagen --prompts 64 --max-tokens 128 --threads 1

Runs `datagen.generate_data` (the engine answers the first N training prompts at temperatures
0 and 0.7, shards of --shard-size; each finished conversation gets one teacher-forced pass for its
hidden states) into a temporary directory and reports answer tokens per second of wall time and
per second of this process's CPU time (steadier on a shared machine). To compare with another
checkout, run the same file with PYTHONPATH pointing at it: only `engines` is imported from there.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch

from engines.builtin.speculative.eagle3.config import default_aux_layers
from training.eagle3.datagen import DataGenConfig, data_engine, generate_data
from training.eagle3.dataset import read_conversations
from training.eagle3.prompts import build_prompts, split


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--prompts", type=int, default=64, help="first N training prompts (x 2 temperatures)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--shard-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    engine = data_engine(args.model, args.threads, args.max_tokens)
    aux_layers = default_aux_layers(engine.runner.model_config.num_layers)
    prompts = split(build_prompts())[0][: args.prompts]
    with tempfile.TemporaryDirectory() as tmp:
        config = DataGenConfig(Path(tmp), aux_layers, max_tokens=args.max_tokens, shard_size=args.shard_size)
        wall, cpu = time.monotonic(), time.process_time()
        paths = generate_data(engine, prompts, config)
        wall, cpu = time.monotonic() - wall, time.process_time() - cpu
        conversations = read_conversations(paths)
    answer_tokens = sum(len(c.token_ids) - c.prompt_len for c in conversations)
    print(json.dumps({
        "conversations": len(conversations), "answer_tokens": answer_tokens,
        "tokens": sum(len(c.token_ids) for c in conversations),
        "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
        "answer_tokens_per_s": round(answer_tokens / wall, 1), "answer_tokens_per_cpu_s": round(answer_tokens / cpu, 1),
        "max_num_seqs": engine.config.max_num_seqs, "threads": args.threads, "load_average": os.getloadavg(),
    }))


if __name__ == "__main__":
    main()
