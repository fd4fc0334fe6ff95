"""`x-edgerun-reject-if-busy: 1`: the gateway asks a backend to refuse a request it cannot start at once.

A client's `options.rejectIfBusy` (Workers AI) wants 429 rather than a wait. The gateway sends this
header with the backend request; our backend then admits it only while its engine's running batch
has room, and answers 429 rather than queueing it, so the gateway tries the next backend or
answers 429 / 3040. trtllm-serve, vLLM and SGLang ignore the header: behind them such a request
may still wait in the server's own queue.
"""

from __future__ import annotations

REJECT_IF_BUSY_HEADER = "x-edgerun-reject-if-busy"
