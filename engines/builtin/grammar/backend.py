"""The seam between the engine and a grammar library: compile a `Guide`, match one sequence.

`GrammarBackend.compile(guide)` turns a guide into the library's compiled grammar (slow: tens of
milliseconds to seconds for a large schema; callers run it off the event loop and cache it, see
`cache.py`); `matcher(compiled)` starts one sequence's matcher (cheap). A `Matcher` writes the
bitmask of tokens allowed next into one row of a batch bitmask and consumes each sampled token.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from engines.guided import Guide


class Matcher(Protocol):
    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None: ...
    def accept(self, token_id: int) -> bool: ...  # False: the token breaks the grammar
    def is_terminated(self) -> bool: ...  # the grammar is complete and its stop token was accepted


class GrammarBackend(Protocol):
    name: str
    vocab_size: int

    def compile(self, guide: Guide) -> Any: ...  # raises engines.errors.InvalidRequest
    def matcher(self, compiled: Any) -> Matcher: ...
