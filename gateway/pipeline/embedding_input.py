"""Embedding request bodies parsed into the texts to encode, with a message naming the field when
one is wrong. Workers AI: `{"text": "..." | ["...", ...]}`; OpenAI: `{"model", "input": ...}`.
The field rule of gateway/pipeline/request_fields.py applies first (`pooling`, `dimensions` and the batch
API's fields are refused)."""

from __future__ import annotations

from typing import Any, Literal, cast

from gateway.errors import InvalidInput
from gateway.pipeline.request_fields import (
    EMBEDDINGS_REFUSED,
    OPENAI_EMBEDDINGS,
    WORKERS_AI_EMBEDDINGS,
    accepted_fields,
)
from gateway.pipeline.schemas import MAX_PROMPT_CHARS

MAX_TEXTS = 100  # Workers AI's batch limit for its embedding models
EncodingFormat = Literal["float", "base64"]


def _texts(value: Any, name: str) -> tuple[str, ...]:
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not 1 <= len(texts) <= MAX_TEXTS:
        raise InvalidInput(f"{name} must be a string or an array of 1 to {MAX_TEXTS} strings", param=name)
    for i, text in enumerate(texts):
        if not isinstance(text, str) or not 1 <= len(text) <= MAX_PROMPT_CHARS:
            raise InvalidInput(f"{name}[{i}] must be a string of 1 to {MAX_PROMPT_CHARS} characters", param=name)
    return tuple(texts)


def parse_workers_ai_embedding(body: dict[str, Any]) -> tuple[str, ...]:
    """`POST /ai/run/{model}` for a text-embeddings model."""
    fields = accepted_fields(body, WORKERS_AI_EMBEDDINGS, "a Workers AI text-embeddings request", EMBEDDINGS_REFUSED)
    if fields.get("text") is None and ("prompt" in body or "messages" in body):
        raise InvalidInput("text is missing: an embedding model embeds text (prompt and messages are text-generation "
                           "inputs)", param="text")
    return _texts(fields.get("text"), "text")


def parse_openai_embedding(body: dict[str, Any]) -> tuple[tuple[str, ...], EncodingFormat]:
    """`POST /ai/v1/embeddings` (the model was read already): the texts and how to encode vectors."""
    body = accepted_fields(body, OPENAI_EMBEDDINGS, "an embeddings request", EMBEDDINGS_REFUSED)
    texts = _texts(body.get("input"), "input")
    encoding = body.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise InvalidInput("encoding_format must be 'float' or 'base64'", param="encoding_format")
    return texts, cast(EncodingFormat, encoding)
