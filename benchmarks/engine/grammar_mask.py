"""Per-token cost of grammar-constrained decoding: xgrammar against llguidance on this CPU.

Both libraries get SmolLM2's tokenizer (49,152 tokens) and the same JSON schemas. For each schema
the script compiles the grammar (cold, then from a warm compiler for xgrammar, whose cache is part
of its design), then walks the token ids of a valid instance, timing each step's mask computation
(the bitmask of allowed tokens, what the sampler needs before every constrained token) and the
token's acceptance. Rounds alternate between the libraries (benchmarks/common.py) so both see
the same machine load. Prints one JSON object.

    pip install --no-deps xgrammar==0.2.8 apache-tvm-ffi   # only this benchmark needs xgrammar
    python -m benchmarks.engine.grammar_mask --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from benchmarks.common import interleave
from engines.builtin.loader import smollm2_gguf_path
from engines.builtin.text.tokenizer import Tokenizer
from tests.engines.fixtures_model import read_gguf_tokenizer

SCHEMAS: dict[str, tuple[dict[str, Any], Any]] = {
    "flat": (
        {
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "admin": {"type": "boolean"}},
            "required": ["name", "age", "admin"],
        },
        {"name": "Ada Lovelace", "age": 36, "admin": True},
    ),
    "nested": (
        {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 40},
                "days": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "day": {"enum": ["mon", "tue", "wed", "thu", "fri"]},
                            "temp_c": {"type": "number"},
                            "rain": {"type": "boolean"},
                        },
                        "required": ["day", "temp_c", "rain"],
                    },
                    "maxItems": 5,
                },
            },
            "required": ["city", "days"],
        },
        {"city": "Lisbon", "days": [{"day": "mon", "temp_c": 21.5, "rain": False}, {"day": "tue", "temp_c": 19, "rain": True}]},
    ),
    "any_json": (
        {"type": "object"},  # JSON mode without a schema: any object
        {"answer": "forty-two", "steps": [1, 2, 3], "done": True, "notes": None},
    ),
}


@dataclass(slots=True)
class Walk:
    compile_s: float
    mask_s: list[float]  # per token
    accept_s: list[float]


def timed_walk(compile_s: float, token_ids: list[int], fill_mask: Callable[[], object],
               accept: Callable[[int], bool], refused: Callable[[int], str]) -> Walk:
    """Walk `token_ids` through a compiled grammar's matcher, timing each mask fill and each accept."""
    masks, accepts = [], []
    for token_id in token_ids:
        t0 = time.perf_counter()
        fill_mask()
        t1 = time.perf_counter()
        assert accept(token_id), refused(token_id)
        masks.append(t1 - t0)
        accepts.append(time.perf_counter() - t1)
    return Walk(compile_s, masks, accepts)


def xgrammar_tokenizer_info(tokenizer: Tokenizer) -> Any:
    """xgrammar's view of our byte-level BPE vocabulary (ids in order, raw byte-level spellings)."""
    import xgrammar as xgr

    encoded = [""] * tokenizer.vocab_size
    for token, token_id in tokenizer.backend.get_vocab(with_added_tokens=True).items():
        encoded[token_id] = token
    return xgr.TokenizerInfo(
        encoded, xgr.VocabType.BYTE_LEVEL, vocab_size=tokenizer.vocab_size, stop_token_ids=sorted(tokenizer.eos_token_ids)
    )


def xgrammar_runner(tokenizer: Tokenizer) -> Callable[[dict[str, Any], list[int]], Walk]:
    import xgrammar as xgr

    info = xgrammar_tokenizer_info(tokenizer)

    def run(schema: dict[str, Any], token_ids: list[int]) -> Walk:
        compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)  # cold each round
        t0 = time.perf_counter()
        compiled = compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(", ", ": "))
        compile_s = time.perf_counter() - t0
        matcher = xgr.GrammarMatcher(compiled)
        bitmask = xgr.allocate_token_bitmask(1, info.vocab_size)
        return timed_walk(compile_s, token_ids, partial(matcher.fill_next_token_bitmask, bitmask), matcher.accept_token,
                          lambda token_id: f"xgrammar refused token {token_id}")

    return run


def llguidance_runner(tokenizer: Tokenizer) -> Callable[[dict[str, Any], list[int]], Walk]:
    import llguidance
    import llguidance.torch as llg_torch

    from engines.builtin.grammar.llguidance_backend import COMPACT_JSON, ll_tokenizer

    lltok = ll_tokenizer(tokenizer)

    def run(schema: dict[str, Any], token_ids: list[int]) -> Walk:
        t0 = time.perf_counter()
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=COMPACT_JSON)
        matcher = llguidance.LLMatcher(lltok, grammar)
        compile_s = time.perf_counter() - t0
        assert not matcher.is_error(), matcher.get_error()
        bitmask = llg_torch.allocate_token_bitmask(1, lltok.vocab_size)
        return timed_walk(compile_s, token_ids, partial(llg_torch.fill_next_token_bitmask, matcher, bitmask, 0),
                          matcher.consume_token,
                          lambda token_id: f"llguidance refused token {token_id}: {matcher.get_error()}")

    return run


def apply_mask_cost(vocab_size: int, rows: int, repeats: int = 200) -> float:
    """Seconds to apply one int32 bitmask to `rows` rows of float32 logits (our sampler's way)."""
    from engines.builtin.grammar.mask import apply_bitmask

    torch.set_num_threads(1)

    logits = torch.randn(rows, vocab_size)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (rows, (vocab_size + 31) // 32), dtype=torch.int32)
    apply_bitmask(logits, bitmask)
    t0 = time.perf_counter()
    for _ in range(repeats):
        apply_bitmask(logits.clone(), bitmask)
    return (time.perf_counter() - t0) / repeats


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarise(walks: list[Walk]) -> dict[str, float]:
    masks = [m for w in walks for m in w.mask_s]
    accepts = [a for w in walks for a in w.accept_s]
    return {
        "compile_ms_median": round(statistics.median(w.compile_s for w in walks) * 1e3, 2),
        "mask_us_p50": round(percentile(masks, 0.5) * 1e6, 1),
        "mask_us_p90": round(percentile(masks, 0.9) * 1e6, 1),
        "mask_us_p99": round(percentile(masks, 0.99) * 1e6, 1),
        "accept_us_p50": round(percentile(accepts, 0.5) * 1e6, 1),
        "tokens": len(masks),
    }


async def main(rounds: int) -> dict[str, Any]:
    tokenizer = read_gguf_tokenizer(smollm2_gguf_path())
    xgr_run, llg_run = xgrammar_runner(tokenizer), llguidance_runner(tokenizer)
    report: dict[str, Any] = {"vocab_size": tokenizer.vocab_size, "load_average": os.getloadavg(), "schemas": {}}
    for name, (schema, instance) in SCHEMAS.items():
        token_ids = tokenizer.encode(json.dumps(instance, separators=(", ", ": ")))

        async def xgr_round(schema: dict[str, Any] = schema, ids: list[int] = token_ids) -> Walk:
            return xgr_run(schema, ids)

        async def llg_round(schema: dict[str, Any] = schema, ids: list[int] = token_ids) -> Walk:
            return llg_run(schema, ids)

        paired = await interleave(xgr_round, llg_round, rounds)
        report["schemas"][name] = {"xgrammar": summarise(paired.baseline), "llguidance": summarise(paired.subject)}
    report["apply_mask_us"] = {rows: round(apply_mask_cost(tokenizer.vocab_size, rows) * 1e6, 1) for rows in (1, 8)}
    report["load_average_end"] = os.getloadavg()
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.rounds)), indent=1))
