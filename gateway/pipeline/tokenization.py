"""Tokenize once at the gateway: chat template + tokenizer per model, fetched once and cached.

Where a model's tokenizer comes from, first hit wins:
1. memory (one `ModelTokenizer` per model id, built once per process);
2. a local Hugging Face tokenizer directory, when the catalog names one (`tokenizer_dir`), for
   third-party backends (trtllm-serve, vLLM) that do not serve ours;
3. the file cache `<cache_dir>/<model>_<backend model>.json` written by an earlier fetch;
4. `GET /edgerun/v1/tokenizer` on a backend serving the model (`BackendClient.tokenizer`),
   tried in the order given (healthy ones first), then written to the file cache.

The payload is a `contracts.tokenizer.TokenizerPayload` (what the backend's tokenizer route
writes: `tokenizer_json`, `chat_template`, special tokens, `add_bos_token`, `max_model_len`).
Text is encoded as the built-in engine encodes it: no post-processor specials, the BOS id in
front of raw prompts when `add_bos_token` is set. In a chat prompt only the template's own special
tokens are control tokens: `<|im_start|>` written in a message is tokenized as plain text
(`contracts.chat_tokens`). A raw prompt is the client's whole prompt, special tokens included.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from backends.client import BackendClient, BackendError, Endpoint
from contracts.chat_tokens import ChatTokens, Masked
from contracts.tokenizer import TokenizerPayload
from gateway.errors import InvalidInput, OutOfCapacity
from gateway.fleet.catalog import ModelSpec
from gateway.pipeline.chat_template import ChatTemplate
from gateway.pipeline.offload import Offload, is_large
from gateway.pipeline.schemas import Prompt
from gateway.pipeline.tools import with_tools_prompt


@dataclass(frozen=True, slots=True)
class ModelTokenizer:
    model_id: str
    tokenizer: Tokenizer
    template: ChatTemplate | None
    max_model_len: int
    bos_token_id: int | None  # put in front of raw prompts when the model asks for it
    chat: ChatTokens

    @classmethod
    def from_payload(cls, model: ModelSpec, payload: TokenizerPayload) -> ModelTokenizer:
        tokenizer = Tokenizer.from_str(payload["tokenizer_json"])
        template = payload.get("chat_template")
        bos = payload.get("bos_token")
        return cls(
            model_id=model.id,
            tokenizer=tokenizer,
            template=ChatTemplate(template, bos_token=bos, eos_token=payload.get("eos_token")) if template else None,
            max_model_len=int(model.context_length or payload["max_model_len"] or 0),  # _payload refuses neither being set
            bos_token_id=tokenizer.token_to_id(bos) if bos and payload.get("add_bos_token") else None,
            chat=ChatTokens(tokenizer, Tokenizer.from_str(payload["tokenizer_json"])),  # built now, not mid-request
        )

    def render(self, prompt: Prompt) -> tuple[str, Masked]:
        """A chat prompt's text, rendered from the client's values with their special-token strings
        masked, and the masking (`self.chat.encode` takes both).

        A chat template writes its own BOS, as `transformers` assumes when it applies one.
        """
        messages, use = prompt.messages, prompt.tools
        assert messages is not None
        if self.template is None:
            raise InvalidInput(f"{self.model_id} has no chat template: send prompt with raw: true", param="messages")
        if use is not None and self.template.renders_tools:  # the model's own tool format
            masked = self.chat.mask((messages, use.template_tools()))
            shown, tools = masked.value
            return self.template.render(shown, tools=tools), masked
        masked = self.chat.mask(messages if use is None else with_tools_prompt(messages, use))
        return self.template.render(masked.value), masked

    def encode_text(self, text: str, is_raw: bool = False) -> list[int]:
        """Token ids of `text`; special tokens written in it (`<|im_start|>`) are matched whole.

        `encode_batch_fast` gives `encode`'s ids without working out character offsets, which the
        gateway never reads: 17-20% less time for SmolLM2's tokenizer, short prompts and long
        (tests/gateway/pipeline/test_tokenization.py compares the ids). Like `encode_batch`, it lets go of
        the GIL while it runs, so the offload pool's threads tokenize beside the event loop."""
        ids = self.tokenizer.encode_batch_fast([text], add_special_tokens=False)[0].ids
        return [self.bos_token_id, *ids] if is_raw and self.bos_token_id is not None else ids

    def encode_prompt(self, prompt: Prompt) -> list[int]:
        """Template + tokenizer, synchronously: the prompt's token ids."""
        if prompt.messages is None:
            assert prompt.text is not None
            ids = self.encode_text(prompt.text, is_raw=True)
        else:
            ids = self.chat.encode(*self.render(prompt))
        if not ids:
            raise InvalidInput("the prompt encodes to zero tokens", param="prompt")
        return ids

    async def encode(self, prompt: Prompt, offload: Offload | None = None) -> list[int]:
        """`encode_prompt`, on the offload pool when the prompt is large (inline without a pool)."""
        if offload is None or not is_large(prompt_size(prompt)):  # inline: no closure, no coroutine more
            return self.encode_prompt(prompt)
        return await offload.run(lambda: self.encode_prompt(prompt))


def prompt_size(prompt: Prompt) -> int:
    """Characters of text in the prompt (what templating and tokenizing cost grows with)."""
    if prompt.text is not None:
        return len(prompt.text)
    return sum(len(value) for message in prompt.messages or () for value in message.values())


def load_hf_dir(path: Path) -> TokenizerPayload:
    """A tokenizer payload from a Hugging Face directory (tokenizer.json + tokenizer_config.json)."""
    config_path = path / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    template = config.get("chat_template")
    if (path / "chat_template.jinja").exists():
        template = (path / "chat_template.jinja").read_text()

    def special(name: str) -> str | None:
        value = config.get(name)
        return value.get("content") if isinstance(value, dict) else value

    if isinstance(template, list):  # [{name, template}, ...]: the default one
        template = next((t["template"] for t in template if t.get("name") == "default"), template[0]["template"])
    return {
        "tokenizer_json": (path / "tokenizer.json").read_text(),
        "chat_template": template,
        "bos_token": special("bos_token"),
        "eos_token": special("eos_token"),
        "add_bos_token": bool(config.get("add_bos_token", False)),
        "max_model_len": int(config.get("model_max_length") or 0) or None,
    }


class TokenizerRegistry:
    """Builds each model's tokenizer once; concurrent first requests share one fetch."""

    def __init__(self, cache_dir: Path | None, client: BackendClient) -> None:
        self._cache_dir = cache_dir
        self._client = client
        self._loaded: dict[str, ModelTokenizer] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def get(self, model: ModelSpec, endpoints: Callable[[], Sequence[Endpoint]]) -> ModelTokenizer:
        """The model's tokenizer; `endpoints` (the backends to fetch it from, in order of
        preference) is only called when it is not loaded yet, so the hot path skips it."""
        loaded = self._loaded.get(model.id)
        if loaded is not None:
            return loaded
        lock = self._locks.setdefault(model.id, asyncio.Lock())
        async with lock:
            if model.id not in self._loaded:
                payload = await self._payload(model, endpoints())
                self._loaded[model.id] = ModelTokenizer.from_payload(model, payload)
        return self._loaded[model.id]

    async def _payload(self, model: ModelSpec, endpoints: Sequence[Endpoint]) -> TokenizerPayload:
        if model.tokenizer_dir is not None:
            payload = load_hf_dir(model.tokenizer_dir)
            if not (model.context_length or payload["max_model_len"]):
                raise ValueError(f"{model.id}: set context_length, {model.tokenizer_dir} has no model_max_length")
            return payload
        cache_file = self._cache_file(model)
        if cache_file is not None and cache_file.exists():
            try:
                cached: TokenizerPayload = json.loads(cache_file.read_text())
                return cached
            except ValueError:
                cache_file.unlink(missing_ok=True)  # a torn write: fetch again
        if not endpoints:
            raise OutOfCapacity(f"no backend serves {model.id}, so its tokenizer cannot be fetched")
        errors = []
        for endpoint in endpoints:
            try:
                payload = await self._client.tokenizer(endpoint)
            except BackendError as exc:
                errors.append(exc.message)
                continue
            if cache_file is not None:
                cache_file.parent.mkdir(parents=True, exist_ok=True)
                tmp = cache_file.with_suffix(".tmp")
                tmp.write_text(json.dumps(payload))
                tmp.replace(cache_file)
            return payload
        raise OutOfCapacity(f"no backend could provide the tokenizer of {model.id}: {'; '.join(errors)}")

    def _cache_file(self, model: ModelSpec) -> Path | None:
        """`<cache_dir>/<model id>_<backend model>.json`: a catalog change of backend model refetches."""
        if self._cache_dir is None:
            return None
        name = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{model.id}@{model.backend_model}").strip("_")
        return self._cache_dir / f"{name}.json"
