"""Measure the model runner alone: decode tokens/s at a batch size and context length, cold start,
and transformers' greedy generate on the same weights as the baseline.

    python -m benchmarks.engine.runner --batch 1 16 --context 512 --hf [--weight-dtype float16] [--threads 1]

benchmarks/engine/compare.py measures the whole engine; this is for quick runs of the runner alone.
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import torch

from engines.builtin.config import EngineConfig
from engines.builtin.runner.model_runner import ForwardItem, ModelRunner


@dataclass(slots=True)
class DecodeResult:
    batch_size: int
    context_len: int
    step_seconds: list[float]  # wall time of each step
    step_cpu_seconds: list[float]  # process CPU time of each step: with one thread, less moved by a busy machine

    @property
    def seconds(self) -> float:
        return sum(self.step_seconds)

    @property
    def tokens_per_s(self) -> float:
        return self.batch_size * len(self.step_seconds) / self.seconds

    @property
    def ms_per_step(self) -> float:
        return 1000 * self.seconds / len(self.step_seconds)

    @property
    def median_cpu_ms_per_step(self) -> float:
        return 1000 * statistics.median(self.step_cpu_seconds)

    def summary(self, label: str) -> str:
        return (
            f"{label} batch={self.batch_size} context={self.context_len}: {self.tokens_per_s:.1f} tok/s "
            f"({self.ms_per_step:.1f} ms/step wall; median CPU {self.median_cpu_ms_per_step:.1f} ms/step "
            f"= {1000 * self.batch_size / self.median_cpu_ms_per_step:.1f} tok/s)"
        )


def measure_decode(runner: ModelRunner, batch_size: int, context_len: int, num_steps: int = 32, first_block: int = 0) -> DecodeResult:
    """Prefill `batch_size` sequences of `context_len` tokens, then time `num_steps` batched greedy decode steps."""
    bs = runner.block_size
    blocks_per_seq = math.ceil((context_len + num_steps) / bs)
    if first_block + batch_size * blocks_per_seq > runner.config.num_kv_blocks:
        raise ValueError(f"needs {batch_size * blocks_per_seq} KV blocks; build the runner with more num_kv_blocks")
    vocab = min(runner.model_config.vocab_size, runner.tokenizer.vocab_size)
    generator = torch.Generator().manual_seed(0)
    tables, tokens = [], []
    for i in range(batch_size):
        table = list(range(first_block + i * blocks_per_seq, first_block + (i + 1) * blocks_per_seq))
        prompt = torch.randint(0, vocab, (context_len,), generator=generator).tolist()
        logits = runner.execute([ForwardItem(prompt, 0, table)])
        tables.append(table)
        tokens.append(int(logits[0].argmax()))
    runner.execute([ForwardItem([t], context_len, table) for t, table in zip(tokens, tables)])  # warm-up step
    walls, cpus = [], []
    for step in range(num_steps):
        start, cpu_start = time.perf_counter(), time.process_time()
        logits = runner.execute([ForwardItem([t], context_len + step, table) for t, table in zip(tokens, tables)])
        tokens = logits.argmax(-1).tolist()
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu_start)
    return DecodeResult(batch_size, context_len, walls, cpus)


def measure_hf_decode(context_len: int, num_new: int = 32) -> DecodeResult:
    """transformers' greedy generate (float32) on the SmolLM2 GGUF; steps timed from a logits processor."""
    from transformers import AutoModelForCausalLM, LogitsProcessor, LogitsProcessorList

    class StepClock(LogitsProcessor):
        def __init__(self) -> None:
            self.walls: list[float] = []
            self.cpus: list[float] = []

        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            self.walls.append(time.perf_counter())
            self.cpus.append(time.process_time())
            return scores

    from engines.builtin.loader import smollm2_gguf_path

    path = smollm2_gguf_path()
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    prompt = torch.randint(0, model.config.vocab_size, (1, context_len), generator=torch.Generator().manual_seed(0))
    kwargs = {"do_sample": False, "pad_token_id": 0, "eos_token_id": None}
    clock = StepClock()
    with torch.no_grad():
        model.generate(prompt, max_new_tokens=2, **kwargs)  # warm-up
        model.generate(
            prompt, max_new_tokens=num_new + 1, min_new_tokens=num_new + 1,
            logits_processor=LogitsProcessorList([clock]), **kwargs,
        )
    # the first call follows the prefill; each later one marks the end of one decode step
    walls = [b - a for a, b in zip(clock.walls, clock.walls[1:])]
    cpus = [b - a for a, b in zip(clock.cpus, clock.cpus[1:])]
    return DecodeResult(1, context_len, walls, cpus)


def measure_cold_start(model: str = "smollm2", dtype: str = "float32", num_kv_blocks: int = 512) -> float:
    """Seconds from a fresh interpreter's start to a loaded runner (imports included)."""
    code = (
        "from engines.builtin.config import EngineConfig; from engines.builtin.runner.model_runner import ModelRunner; "
        f"ModelRunner(EngineConfig(model={model!r}, dtype={dtype!r}, num_kv_blocks={num_kv_blocks}))"
    )
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--weight-dtype", default="auto", help="auto, float16 (fbgemm float16 linear weights, CPU) or the dtype")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--hf", action="store_true", help="also measure transformers' greedy generate (SmolLM2 only)")
    parser.add_argument("--cold-start", action="store_true")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.cold_start:
        print(f"cold start: {measure_cold_start(args.model, args.dtype):.2f} s")
    blocks = max(args.batch) * math.ceil((args.context + args.steps + 1) / 16) + 1
    config = EngineConfig(model=args.model, dtype=args.dtype, device=args.device, num_kv_blocks=blocks, weight_dtype=args.weight_dtype)
    runner = ModelRunner(config)
    for batch in args.batch:
        result = measure_decode(runner, batch, args.context, args.steps)
        print(result.summary(f"edgerun {args.dtype} weight_dtype={args.weight_dtype} threads={torch.get_num_threads()}"))
    if args.hf:
        result = measure_hf_decode(args.context, args.steps)
        print(result.summary(f"transformers float32 threads={torch.get_num_threads()}"))


if __name__ == "__main__":
    main()
