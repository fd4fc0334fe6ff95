"""How far the fast mode is from the exact model: greedy agreement and logit error over real prompts.

The deterministic runner (float32 weights exactly as loaded) generates each prompt's greedy
continuation. The fast runner then decodes the same tokens (teacher forcing, so one early difference
does not derail the rest) and every step's logits are compared: top-1 agreement, max and mean
absolute logit error. It also generates freely, and the result counts how many tokens of each
prompt's greedy output are identical before the first difference.

`rows=1` runs every prompt alone (decode steps of one row: the packed 4-bit path); `rows=P` runs all
prompts as one batch of P decode rows (16 and more: the dense bfloat16 path). `drafts=k` has the fast
runner decode the reference tokens as speculative verify rows instead: the last committed token and the
next k reference tokens in one row, logits at each (what a verify row computes when every draft is
accepted; the fused step's causal rows in the default mode), so verify rows are held to the same tolerance. Prompts are the chat
and copy prompts of data/prompts.json under the model's chat template. test_quant.py asserts the
stated tolerance with it; `python -m benchmarks.engine.quant_tolerance` reports it at length.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from engines.builtin.runner.model_runner import ForwardItem, ModelRunner

PROMPTS_FILE = Path(__file__).resolve().parents[2] / "data" / "prompts.json"


def load_prompts(runner: ModelRunner) -> list[list[int]]:
    texts = [t for group in json.loads(PROMPTS_FILE.read_text()).values() for t in group]
    tok = runner.tokenizer
    return [tok.encode(tok.apply_chat_template([{"role": "user", "content": t}])) for t in texts]


@dataclass(slots=True)
class Agreement:
    num_tokens: int = 0
    num_top1_agree: int = 0
    max_abs_error: float = 0.0
    sum_abs_error: float = 0.0  # over every logit of every token
    num_logits: int = 0
    matching_prefix: list[int] = field(default_factory=list)  # per prompt: free-run tokens equal to the reference's

    def add(self, subject: Tensor, reference: Tensor) -> None:
        # subject, reference: [n, V] logits of the same positions
        err = (subject - reference).abs()
        self.num_tokens += subject.shape[0]
        self.num_top1_agree += int((subject.argmax(-1) == reference.argmax(-1)).sum())
        self.max_abs_error = max(self.max_abs_error, float(err.max()))
        self.sum_abs_error += float(err.sum())
        self.num_logits += err.numel()

    @property
    def top1(self) -> float:
        return self.num_top1_agree / self.num_tokens

    @property
    def mean_abs_error(self) -> float:
        return self.sum_abs_error / self.num_logits

    def summary(self) -> str:
        return (f"top-1 agreement {self.num_top1_agree}/{self.num_tokens} = {100 * self.top1:.2f}%, "
                f"logit error max {self.max_abs_error:.3f} mean {self.mean_abs_error:.4f}; "
                f"free-run greedy identical tokens before the first difference: median "
                f"{statistics.median(self.matching_prefix):.0f}, per prompt {self.matching_prefix}")


def decode(runner: ModelRunner, prompts: list[list[int]], num_tokens: int, rows: int,
           forced: list[list[int]] | None = None) -> tuple[list[list[int]], list[Tensor]]:
    """Prefill each prompt, then `num_tokens - 1` decode steps in batches of `rows` prompts; the next
    token is forced[p][step] when given, else the argmax. -> (tokens [P][num_tokens], logits [P][num_tokens, V])."""
    bs = runner.block_size
    tables, first = [], 0
    for prompt in prompts:
        n = math.ceil((len(prompt) + num_tokens) / bs)
        tables.append(list(range(first, first + n)))
        first += n
    if first > runner.config.num_kv_blocks:
        raise ValueError(f"{first} KV blocks needed, the runner has {runner.config.num_kv_blocks}")
    logits = [[runner.execute([ForwardItem(p, 0, t)])[0]] for p, t in zip(prompts, tables)]
    tokens: list[list[int]] = [[] for _ in prompts]
    for step in range(num_tokens):
        for p in range(len(prompts)):
            tokens[p].append(forced[p][step] if forced else int(logits[p][-1].argmax()))
        if step == num_tokens - 1:
            break
        for start in range(0, len(prompts), rows):
            group = range(start, min(start + rows, len(prompts)))
            items = [ForwardItem([tokens[p][-1]], len(prompts[p]) + step, tables[p]) for p in group]
            for p, row in zip(group, runner.execute(items)):
                logits[p].append(row)
    return tokens, [torch.stack(rows_) for rows_ in logits]


def decode_verify_rows(runner: ModelRunner, prompts: list[list[int]], forced: list[list[int]], drafts: int,
                       rows: int) -> list[Tensor]:
    """`decode` of the forced tokens as verify rows of 1 + `drafts` tokens (the last shorter), `rows` prompts a step:
    the logits [num_tokens, V] of each prompt, as a speculative engine gets them when every draft is accepted."""
    bs = runner.block_size
    tables, first = [], 0
    for prompt, tokens in zip(prompts, forced):
        n = math.ceil((len(prompt) + len(tokens)) / bs)
        tables.append(list(range(first, first + n)))
        first += n
    if first > runner.config.num_kv_blocks:
        raise ValueError(f"{first} KV blocks needed, the runner has {runner.config.num_kv_blocks}")
    logits = [[runner.execute([ForwardItem(p, 0, t)])[0:1]] for p, t in zip(prompts, tables)]
    num_tokens = len(forced[0])
    for step in range(0, num_tokens - 1, 1 + drafts):  # the row: forced[step] (committed), then drafts after it
        for start in range(0, len(prompts), rows):
            group = range(start, min(start + rows, len(prompts)))
            row_len = min(1 + drafts, num_tokens - 1 - step)
            items = [ForwardItem(forced[p][step : step + row_len], len(prompts[p]) + step, tables[p], num_logits=row_len)
                     for p in group]
            out = runner.execute(items)
            for i, p in enumerate(group):
                logits[p].append(out[i * row_len : (i + 1) * row_len])
    return [torch.cat(parts) for parts in logits]


def compare(reference: ModelRunner, subject: ModelRunner, prompts: list[list[int]], num_tokens: int, rows: int,
            drafts: int = 0) -> Agreement:
    ref_tokens, ref_logits = decode(reference, prompts, num_tokens, rows=len(prompts))
    if drafts:
        forced_logits = decode_verify_rows(subject, prompts, ref_tokens, drafts, rows)
    else:
        _, forced_logits = decode(subject, prompts, num_tokens, rows, forced=ref_tokens)
    free_tokens, _ = decode(subject, prompts, num_tokens, rows)
    result = Agreement()
    for sub, ref in zip(forced_logits, ref_logits):
        result.add(sub, ref)
    for free, ref in zip(free_tokens, ref_tokens):
        result.matching_prefix.append(next((i for i, (a, b) in enumerate(zip(free, ref)) if a != b), len(ref)))
    return result
