"""A small real `tokenizers` BPE with a ChatML template, for tests that need a tokenizer payload
without loading the model (the end-to-end tests use the backend's own)."""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokenizers import Tokenizer

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@lru_cache(maxsize=1)
def small_tokenizer_json() -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=["<s>", "<|im_start|>", "<|im_end|>"], show_progress=False
    )
    tokenizer.train_from_iterator([f"the quick brown fox {i} jumps over the lazy dog" for i in range(200)], trainer)
    return tokenizer.to_str()


@lru_cache(maxsize=1)
def smollm2_tokenizer() -> Tokenizer:
    """The real SmolLM2 tokenizer, read from its GGUF once per test session (it takes seconds)."""
    from engines.builtin.loader import smollm2_gguf_path
    from tests.engines.fixtures_model import read_gguf_tokenizer

    return read_gguf_tokenizer(smollm2_gguf_path()).backend


def payload(**overrides: Any) -> dict[str, Any]:
    return {
        "model": "tiny",
        "tokenizer_json": small_tokenizer_json(),
        "chat_template": CHATML,
        "bos_token": "<s>",
        "eos_token": "<|im_end|>",
        "add_bos_token": False,
        "max_model_len": 64,
        **overrides,
    }
