"""Compiled grammars by guide: compiled once (off the event loop), shared by every sequence.

A JSON schema or a set of tools is usually sent again and again by the same application, so a
small LRU keyed by the `Guide` (its JSON text) saves the compile on all but the first request.
The lock makes it safe to compile from a thread pool while the engine thread reads it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from engines.builtin.grammar.backend import GrammarBackend, Matcher
from engines.guided import Guide


class GrammarCache:
    def __init__(self, make_backend: Callable[[], GrammarBackend], capacity: int = 256) -> None:
        self._make_backend = make_backend  # built at first use: converting a vocabulary takes a moment
        self._backend: GrammarBackend | None = None
        self.capacity = capacity
        self._compiled: OrderedDict[Guide, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.num_compiles = 0

    @property
    def backend(self) -> GrammarBackend:
        with self._lock:
            if self._backend is None:
                self._backend = self._make_backend()
            return self._backend

    def compile(self, guide: Guide) -> Any:
        """The compiled grammar of `guide` (raises engines.errors.InvalidRequest if it has none)."""
        with self._lock:
            if guide in self._compiled:
                self._compiled.move_to_end(guide)
                return self._compiled[guide]
        compiled = self.backend.compile(guide)  # outside the lock: two threads may both compile once
        with self._lock:
            self.num_compiles += 1
            self._compiled[guide] = compiled
            while len(self._compiled) > self.capacity:
                self._compiled.popitem(last=False)
        return compiled

    def matcher(self, guide: Guide) -> Matcher:
        return self.backend.matcher(self.compile(guide))
