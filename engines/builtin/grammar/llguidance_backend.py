"""Guided decoding with llguidance (trtllm-serve's and vLLM's other grammar backend)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import llguidance
import torch

from engines.builtin.text.tokenizer import Tokenizer
from engines.errors import InvalidRequest
from engines.guided import Guide, closed_objects

if TYPE_CHECKING:  # declared only in llguidance's stub, not importable at run time
    from llguidance._lib import JsonCompileOptions

COMPACT_JSON: JsonCompileOptions = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def ll_tokenizer(tokenizer: Tokenizer, vocab_size: int | None = None) -> llguidance.LLTokenizer:
    return llguidance.LLTokenizer(
        tokenizer.backend.to_str(), n_vocab=vocab_size or tokenizer.vocab_size, eos_token=sorted(tokenizer.eos_token_ids)
    )


class LLGuidanceMatcher:
    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self._matcher = matcher

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        view = bitmask[row]
        self._matcher.unsafe_compute_mask_ptr(view.data_ptr(), view.numel() * view.element_size())

    def accept(self, token_id: int) -> bool:
        return self._matcher.consume_token(token_id)

    def is_terminated(self) -> bool:
        return self._matcher.is_stopped()


class LLGuidanceBackend:
    name = "llguidance"

    def __init__(self, tokenizer: Tokenizer, vocab_size: int | None = None) -> None:
        self.tokenizer = ll_tokenizer(tokenizer, vocab_size)
        self.vocab_size = self.tokenizer.vocab_size

    def compile(self, guide: Guide) -> str:
        """The grammar of `guide`; anything the library refuses or fails on is the request's fault
        (InvalidRequest, a 400): a guide comes from a client, and no guide says anything about the backend."""
        what = guide.kind.replace("_", " ")
        try:
            grammar = self._grammar(guide)
            is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, self.tokenizer)
        except Exception as exc:  # e.g. ValueError('Value is not JSON serializable: 18446744073709551616')
            raise InvalidRequest(f"the {what} cannot be compiled: {exc}") from exc
        if is_error:
            raise InvalidRequest(f"the {what} cannot be compiled: {messages[0]}")
        return grammar

    def _grammar(self, guide: Guide) -> str:
        if guide.kind == "json_object":
            return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=COMPACT_JSON)
        if guide.kind == "json_schema":
            return llguidance.LLMatcher.grammar_from_json_schema(closed_objects(guide.value), defaults=COMPACT_JSON)
        spec = guide.value
        tags = [
            llguidance.StructTag(trigger=_trigger(s["begin"], spec["triggers"]), begin=s["begin"],
                                 grammar=json.dumps(closed_objects(s.get("schema") or {})), end=s["end"])
            for s in spec["structures"]
        ]
        return llguidance.StructTag.to_grammar(tags, assume_special=False)  # triggers are text

    def matcher(self, compiled: Any) -> LLGuidanceMatcher:
        return LLGuidanceMatcher(llguidance.LLMatcher(self.tokenizer, compiled))


def _trigger(begin: str, triggers: list[str]) -> str:
    return next(t for t in triggers if begin.startswith(t))
