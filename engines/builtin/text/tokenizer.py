"""Text <-> token ids, and the model's chat template.

`Tokenizer` wraps a `tokenizers.Tokenizer` (Rust, fast) and renders the chat template with a
sandboxed jinja2 environment configured like transformers' (trim_blocks, lstrip_blocks, a
`raise_exception` helper and a `tojson` filter). Three builders:

- `from_gguf_vocab`: a byte-level BPE from a GGUF's metadata (tokenizer.ggml.tokens / merges /
  token_type / pre). The pre-tokenizer follows llama.cpp's choice for the file's `pre` name
  ("smollm" and friends isolate every digit before the GPT-2 split, as the model was trained).
- `Tokenizer.load(dir)`: tokenizer.json + tokenizer_config.json (a Hugging Face directory, or our cache).
- `byte_level()`: 256 byte tokens plus ChatML specials, for random models without a real vocabulary.

`encode` adds no special tokens unless the model asks for a BOS (`add_bos_token`); special tokens
written in the text (`<|im_start|>`) are matched whole. `encode_chat` renders and encodes a
conversation so that only the template's own special tokens are control tokens: the same strings
in a message are plain text (`contracts.chat_tokens`, as the gateway does). `decode` skips nothing:
special tokens come out as their text, and ids outside the vocabulary (a random model's larger
head) decode to "".
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any

import jinja2
import jinja2.sandbox
import tokenizers
from tokenizers import decoders, models, pre_tokenizers

from contracts.chat_tokens import ChatTokens

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Tokens that end a turn in common vocabularies (llama.cpp treats them as end-of-generation too).
END_OF_TURN_TOKENS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|eom_id|>", "</s>", "<end_of_turn>")

# llama.cpp's pre-tokenizer regexes by the GGUF's tokenizer.ggml.pre name.
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
DIGIT_ISOLATING_PRES = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"}
LLAMA3_PRES = {"llama3", "llama-v3", "llama-bpe", "falcon3", "smaug-bpe", "dbrx"}


def byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (what byte-level vocabularies spell)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    mapping, extra = {}, 0
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def make_pre_tokenizer(pre: str | None) -> pre_tokenizers.PreTokenizer:
    if pre in DIGIT_ISOLATING_PRES:
        return pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
        )
    if pre in LLAMA3_PRES:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(tokenizers.Regex(LLAMA3_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)  # GPT-2's split


def build_byte_level_bpe(
    tokens: list[str], merges: list[str] | list[tuple[str, str]], token_types: list[int], pre: str | None
) -> tokenizers.Tokenizer:
    """A byte-level BPE as llama.cpp reads it from a GGUF. token_type 3 = control (special),
    4 = user-defined (matched whole, not special)."""
    alphabet = set(byte_alphabet().values())
    spelling = byte_alphabet()
    # A few files store a token outside the byte alphabet; spell it byte by byte so BPE can reach it.
    vocab = {tok if set(tok) <= alphabet else "".join(spelling[b] for b in tok.encode()): i for i, tok in enumerate(tokens)}
    pairs = [_merge_pair(m) for m in merges]
    backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
    backend.pre_tokenizer = make_pre_tokenizer(pre)
    backend.decoder = decoders.ByteLevel()
    types = token_types or [1] * len(tokens)
    specials = [t for t, ty in zip(tokens, types) if ty == 3 and set(t) <= alphabet]
    backend.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False) for t in specials])
    backend.add_tokens([tokenizers.AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types) if ty == 4])
    return backend


def _merge_pair(merge: str | tuple[str, str]) -> tuple[str, str]:
    """A GGUF merge ("a b", or a pair already) as the pair BPE takes."""
    if isinstance(merge, str):
        left, _, right = merge.partition(" ")
        return left, right
    return merge[0], merge[1]


def raise_template_error(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


class Tokenizer:
    """Satisfies engines.base.Tokenizer: encode, decode, apply_chat_template, eos_token_ids."""

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        chat_template: str | None = None,
        bos_token_id: int | None = None,
        eos_token_id: int | None = None,
        add_bos_token: bool = False,
    ) -> None:
        self.backend = backend
        self.chat_template = chat_template or CHATML_TEMPLATE
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id  # the template's eos_token
        self.add_bos_token = add_bos_token and bos_token_id is not None
        ends = {i for i in (backend.token_to_id(t) for t in END_OF_TURN_TOKENS) if i is not None}
        # Generation stops at the model's eos and at any end-of-turn token of the vocabulary.
        self.eos_token_ids: set[int] = ends | ({eos_token_id} if eos_token_id is not None else set())
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if self.add_bos_token and self.bos_token_id is not None:
            return [self.bos_token_id, *ids]
        return ids

    def decode(self, token_ids: list[int]) -> str:
        return self.backend.decode([t for t in token_ids if 0 <= t < self.vocab_size], skip_special_tokens=False)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    @cached_property
    def template(self) -> jinja2.Template:
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
        env.globals["raise_exception"] = raise_template_error
        return env.from_string(self.chat_template)

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """Render messages ([{role, content}]) as the model's prompt text."""
        special = {
            "bos_token": self.token_text(self.bos_token_id),
            "eos_token": self.token_text(self.eos_token_id),
        }
        return self.template.render(messages=messages, add_generation_prompt=add_generation_prompt, **special)

    @cached_property
    def chat_tokens(self) -> ChatTokens:
        return ChatTokens(self.backend)

    def encode_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        """The conversation's prompt ids: `apply_chat_template` + `encode`, with special-token strings
        in the messages tokenized as plain text."""
        masked = self.chat_tokens.mask(messages)
        ids = self.chat_tokens.encode(self.apply_chat_template(masked.value, add_generation_prompt), masked)
        return [self.bos_token_id, *ids] if self.add_bos_token and self.bos_token_id is not None else ids

    def token_text(self, token_id: int | None) -> str:
        return "" if token_id is None else (self.backend.id_to_token(token_id) or "")

    # ---- persistence: tokenizer.json + tokenizer_config.json, as in a Hugging Face directory ----

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.backend.save(str(directory / "tokenizer.json"))
        config = {
            "chat_template": self.chat_template,
            "bos_token": self.token_text(self.bos_token_id) or None,
            "eos_token": self.token_text(self.eos_token_id) or None,
            "add_bos_token": self.add_bos_token,
        }
        (directory / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=1))

    @classmethod
    def load(cls, directory: Path, eos_token_id: int | None = None) -> Tokenizer:
        """From tokenizer.json and (optionally) tokenizer_config.json / chat_template.jinja;
        `eos_token_id` (from the model's config) is used when the tokenizer config names none."""
        backend = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
        config_path = directory / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.exists() else {}
        template = config.get("chat_template")
        if isinstance(template, list):  # [{name, template}, ...]: use the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), template[0]["template"])
        template_file = directory / "chat_template.jinja"
        if template is None and template_file.exists():
            template = template_file.read_text()
        eos_id = backend.token_to_id(special_content(config.get("eos_token")) or "")
        bos_id = backend.token_to_id(special_content(config.get("bos_token")) or "")
        return cls(backend, template, bos_id, eos_token_id if eos_id is None else eos_id, bool(config.get("add_bos_token", False)))


def special_content(token: str | dict[str, Any] | None) -> str | None:
    return token.get("content") if isinstance(token, dict) else token


def byte_level() -> Tokenizer:
    """256 byte tokens (ids 0-255) + <|endoftext|> 256, <|im_start|> 257, <|im_end|> 258; ChatML template."""
    spelling = byte_alphabet()
    vocab = {spelling[b]: b for b in range(256)}
    backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    specials = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
    backend.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False) for t in specials])
    return Tokenizer(backend, CHATML_TEMPLATE, bos_token_id=None, eos_token_id=258)
