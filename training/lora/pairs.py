"""Question/answer pairs as training rows: the chat-template prompt the engine would build for the question
(the model's default system prompt included), then the answer and the end-of-turn token, labelled on the
answer only."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor

from engines.builtin.text.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[2]
FRENCH_PAIRS = ROOT / "data" / "french_qa.json"
IGNORE = -100  # cross_entropy's ignore_index: prompt and padding positions


def read_pairs(path: Path = FRENCH_PAIRS) -> list[tuple[str, str]]:
    return [(question, answer) for question, answer in json.loads(path.read_text())]


def encode_pair(tokenizer: Tokenizer, question: str, answer: str, max_answer_tokens: int) -> tuple[list[int], list[int]]:
    """(prompt ids, answer ids ending in the end-of-turn token, cut to max_answer_tokens)."""
    prompt = tokenizer.encode_chat([{"role": "user", "content": question}])
    end = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else min(tokenizer.eos_token_ids)
    return prompt, [*tokenizer.encode(answer), end][:max_answer_tokens]


def answer_labels(rows: list[tuple[list[int], list[int]]]) -> Tensor:
    """Rows of (prompt, answer) -> next-token labels [B, T] (T the longest row): position j is labelled with
    token j + 1 where that token is part of the answer, IGNORE elsewhere (prompt, padding)."""
    length = max(len(p) + len(a) for p, a in rows)
    labels = torch.full((len(rows), length), IGNORE, dtype=torch.long)
    for i, (prompt, answer) in enumerate(rows):
        labels[i, len(prompt) - 1 : len(prompt) + len(answer) - 1] = torch.tensor(answer)
    return labels
