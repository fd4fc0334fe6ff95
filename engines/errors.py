"""Errors an engine raises to its callers.

    EngineError
    ├── InvalidRequest      the request itself is wrong (empty prompt, too long, bad sampling value)
    │   └── AdapterNotFound the LoRA adapter it names is not where the engine finds adapters
    ├── EngineOverloaded    no room now (queue full, KV cache cannot ever hold it); retry later
    └── EngineStopped       the engine is shutting down or has stopped

Messages say what was wrong and how to fix it; servers map them to HTTP statuses.
"""

from __future__ import annotations


class EngineError(Exception):
    pass


class InvalidRequest(EngineError):
    pass


class AdapterNotFound(InvalidRequest):
    pass


class EngineOverloaded(EngineError):
    pass


class EngineStopped(EngineError):
    pass
