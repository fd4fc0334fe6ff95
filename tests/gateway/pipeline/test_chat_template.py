"""Chat templates render like transformers' and run sandboxed."""

from __future__ import annotations

import pytest

from gateway.errors import InternalError, InvalidInput
from gateway.pipeline.chat_template import ChatTemplate
from tests.gateway.fixtures_tokenizer import CHATML


def test_renders_messages_and_generation_prompt() -> None:
    template = ChatTemplate(CHATML)
    text = template.render([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}])
    assert text == "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert not template.render([{"role": "user", "content": "hi"}], add_generation_prompt=False).endswith("assistant\n")


def test_special_tokens_and_hf_helpers() -> None:
    source = "{{ bos_token }}{% for m in messages %}{{ m | tojson }}{% endfor %}{{ eos_token }}"
    assert ChatTemplate(source, bos_token="<s>", eos_token="</s>").render([{"role": "user", "content": "é"}]) == (
        '<s>{"role": "user", "content": "é"}</s>'
    )


def test_raise_exception_becomes_invalid_input() -> None:
    template = ChatTemplate(
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}"
    )
    with pytest.raises(InvalidInput, match="first must be user"):
        template.render([{"role": "assistant", "content": "x"}])


def test_sandbox_refuses_escapes() -> None:
    template = ChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises(InternalError):
        template.render([{"role": "user", "content": "x"}])


def test_syntax_errors_are_reported_at_load() -> None:
    with pytest.raises(ValueError, match="does not compile"):
        ChatTemplate("{% for %}")
