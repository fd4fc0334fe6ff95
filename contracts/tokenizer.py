"""The tokenizer payload: a backend's tokenizer as the gateway fetches it once and caches it.

`GET /edgerun/v1/tokenizer` answers with it (backends/server/tokenizer_route.py); the gateway
also builds one from a Hugging Face directory (a model's `tokenizer_dir`) and keeps it on disk
(gateway/pipeline/tokenization.py). `add_bos_token` says whether the model wants its BOS id in
front of a raw (untemplated) prompt; chat templates write their own BOS.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

TOKENIZER_PATH = "/edgerun/v1/tokenizer"


class TokenizerPayload(TypedDict):
    model: NotRequired[str]  # the backend's model name (absent when read from a directory)
    tokenizer_json: str  # tokenizers.Tokenizer.to_str()
    chat_template: str | None
    bos_token: str | None
    eos_token: str | None
    add_bos_token: bool
    max_model_len: int | None  # None: unknown (a directory without model_max_length)
