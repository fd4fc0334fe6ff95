"""What JSON mode costs inside the built-in engine: free vs guided decoding of the same batch.

SmolLM2 on the CPU, `--batch` requests decoded together, greedy, `--tokens` new tokens each. Free
rows ignore EOS; guided rows follow a schema whose one string must be long (`minLength`), so they
run for the whole budget too. Each round runs the free batch, then the guided one (interleaved:
the machine's load drifts); reported per side: milliseconds per engine step (median over rounds)
and generated tokens per second, and the guided/free ratio. Prints one JSON object.

    python -m benchmarks.engine.guided --batch 4 --tokens 48 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from typing import Any

from benchmarks.common import interleave
from engines.base import GenerationRequest
from engines.builtin.config import EngineConfig
from engines.builtin.engine.llm_engine import LLMEngine
from engines.builtin.runner.model_runner import ModelRunner
from engines.guided import Guide
from engines.sampling_params import SamplingParams

STORY = {
    "type": "object",
    "properties": {"title": {"type": "string", "maxLength": 20}, "story": {"type": "string", "minLength": 2000}},
    "required": ["title", "story"],
}


def decode(engine: LLMEngine, prompt: list[int], batch: int, tokens: int, guided: bool, tag: str) -> tuple[float, int]:
    """(seconds per step after the prefill step, tokens generated)."""
    for i in range(batch):
        sampling = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=not guided,
                                  guide=Guide.json_schema(STORY) if guided else None)
        engine.add_request(GenerationRequest(f"{tag}-{i}", prompt, sampling))
    engine.step()  # prefill (and the first tokens): not what is compared
    steps, generated, started = 0, 0, time.perf_counter()
    while engine.has_unfinished:
        generated += sum(len(o.new_token_ids) for o in engine.step())
        steps += 1
    return (time.perf_counter() - started) / max(steps, 1), generated


async def main(batch: int, tokens: int, rounds: int) -> dict[str, Any]:
    runner = ModelRunner(EngineConfig(model="smollm2", num_kv_blocks=512))
    engine = LLMEngine(EngineConfig(num_kv_blocks=512), runner)
    tok = runner.tokenizer
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Write a story as JSON with a title."}]))
    engine.grammars.compile(Guide.json_schema(STORY))  # compiled once, as the cache does for repeated schemas
    counter = iter(range(1_000_000))

    async def free() -> tuple[float, int]:
        return decode(engine, prompt, batch, tokens, False, f"f{next(counter)}")

    async def guided() -> tuple[float, int]:
        return decode(engine, prompt, batch, tokens, True, f"g{next(counter)}")

    load = os.getloadavg()
    await free()  # warm-up
    paired = await interleave(free, guided, rounds)
    report: dict[str, Any] = {"batch": batch, "tokens": tokens, "rounds": rounds}
    for name, results in (("free", paired.baseline), ("guided", paired.subject)):
        step_s = statistics.median(r[0] for r in results)
        report[name] = {"ms_per_step": round(step_s * 1e3, 1), "tokens_per_s": round(batch / step_s, 1)}
    report["guided_over_free_step_time"] = round(report["guided"]["ms_per_step"] / report["free"]["ms_per_step"], 3)
    report["load_average"] = [load, os.getloadavg()]
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.batch, args.tokens, args.rounds)), indent=1))
