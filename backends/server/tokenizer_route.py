"""`GET /edgerun/v1/tokenizer`: the engine's tokenizer, so the gateway can tokenize once, itself.

The gateway applies the chat template and tokenizes every request before routing (it needs the
token ids to hash prefixes), then sends ids, not text. It must tokenize exactly as this backend
would, so it fetches the tokenizer from here once and caches it. The answer is a
`contracts.tokenizer.TokenizerPayload` (built once per process, a few MB for a 49k vocabulary).
"""

from __future__ import annotations

import json
from typing import Any

import tokenizers
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from backends.server.errors import NotImplementedFeature
from backends.server.state import BackendState
from contracts.tokenizer import TOKENIZER_PATH, TokenizerPayload


def tokenizer_payload(model: str, engine: Any) -> TokenizerPayload:
    """The payload for an engine whose tokenizer wraps a `tokenizers.Tokenizer` as `.backend`
    (engines.builtin.text.tokenizer.Tokenizer)."""
    tokenizer = engine.tokenizer
    inner = getattr(tokenizer, "backend", None)
    if not isinstance(inner, tokenizers.Tokenizer):
        raise NotImplementedFeature(f"{type(tokenizer).__name__} does not expose a tokenizers.Tokenizer to serialise")
    bos, eos = tokenizer.token_text(tokenizer.bos_token_id), tokenizer.token_text(tokenizer.eos_token_id)
    return {
        "model": model,
        "tokenizer_json": inner.to_str(),
        "chat_template": tokenizer.chat_template,
        "bos_token": bos or None,
        "eos_token": eos or None,
        "add_bos_token": bool(tokenizer.add_bos_token),
        "max_model_len": int(engine.max_model_len),
    }


async def tokenizer_info(request: Request) -> Response:
    state: BackendState = request.app.state.backend
    engine = state.ready_engine()  # 503 while the model is still loading
    cached: bytes | None = getattr(request.app.state, "tokenizer_payload", None)
    if cached is None:
        cached = json.dumps(tokenizer_payload(state.model_name, engine), ensure_ascii=False).encode()
        request.app.state.tokenizer_payload = cached
    return Response(cached, media_type="application/json")


ROUTE = Route(TOKENIZER_PATH, tokenizer_info, methods=["GET"])
