"""The field rule: nulls are absent; what the real API accepts is accepted; what would change the
answer and is not honoured is refused by name (a near miss of a known field too, with "did you
mean"); anything else is ignored."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.errors import InvalidInput
from gateway.pipeline.embedding_input import parse_openai_embedding, parse_workers_ai_embedding
from gateway.pipeline.request_fields import (
    EMBEDDINGS_REFUSED,
    GENERATION_REFUSED,
    OPENAI_CHAT,
    OPENAI_COMPLETIONS,
    OPENAI_EMBEDDINGS,
    OPENAI_RESPONSES,
    OPTIONS,
    WORKERS_AI,
    WORKERS_AI_EMBEDDINGS,
    Treatment,
)
from gateway.pipeline.schemas import (
    parse_chat_completions,
    parse_completions,
    parse_responses,
    parse_workers_ai,
    split_finetune,
)

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
MESSAGES = [{"role": "user", "content": "hi"}]
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}

# The fields of Workers AI's published input schemas (models/schema and the model pages): text
# generation's Prompt and Messages forms (with Llama 4's guided_json and tool_choice) and the batch
# API's `requests`; text embeddings' `text`, `pooling` and `requests`.
PUBLISHED_TEXT_GENERATION = (
    "prompt", "messages", "image", "raw", "stream", "max_tokens", "temperature", "top_p", "top_k", "seed",
    "repetition_penalty", "frequency_penalty", "presence_penalty", "lora", "response_format", "functions", "tools",
    "tool_choice", "guided_json", "requests",
)
PUBLISHED_EMBEDDINGS = ("text", "pooling", "requests")


def test_the_body_langchain_cloudflare_sends_runs() -> None:
    """langchain-cloudflare 0.4.3's ChatCloudflareWorkersAI(endpoint_format="workers_ai") sends `stop: null`."""
    inp = parse_workers_ai({"messages": MESSAGES, "temperature": 0.7, "stop": None, "max_tokens": 16})
    assert (inp.sampling.max_tokens, inp.sampling.temperature, inp.sampling.stop) == (16, 0.7, ())


@pytest.mark.parametrize("field", ["stop", "lora", "functions", "frobnicate", "max_token", "n", "options"])
def test_a_null_field_is_absent(field: str) -> None:
    assert parse_workers_ai({"prompt": "hi", field: None}) == parse_workers_ai({"prompt": "hi"})
    assert parse_chat_completions({**CHAT, field: None}) == parse_chat_completions(CHAT)


def test_lora_names_a_finetune_on_ai_run_and_in_model_on_openai_routes() -> None:
    assert parse_workers_ai({"prompt": "hi", "lora": "french"}).lora == "french"
    with pytest.raises(InvalidInput) as caught:
        parse_workers_ai({"prompt": "hi", "lora": 7})
    assert caught.value.param == "lora"
    with pytest.raises(InvalidInput) as caught:
        parse_chat_completions({**CHAT, "lora": "french"})
    assert caught.value.param == "lora" and "<base model>:<finetune>" in caught.value.message
    assert split_finetune("@cf/huggingface/smollm2-135m-instruct:french") == ("@cf/huggingface/smollm2-135m-instruct", "french")
    assert split_finetune("@cf/huggingface/smollm2-135m-instruct") == ("@cf/huggingface/smollm2-135m-instruct", None)
    assert split_finetune("m:") == ("m:", None)


def test_stop_strings_are_honoured_on_every_route() -> None:
    assert parse_workers_ai({"prompt": "hi", "stop": "\n"}).sampling.stop == ("\n",)
    assert parse_workers_ai({"messages": MESSAGES, "stop": [f"s{i}" for i in range(16)]}).sampling.stop[-1] == "s15"
    assert parse_chat_completions({**CHAT, "stop": ["a", "b"]}).sampling.stop == ("a", "b")
    assert parse_completions({"model": "m", "prompt": "x", "stop": "z"}).sampling.stop == ("z",)
    assert parse_responses({"model": "m", "input": "x", "stop": ["."]}).generation.sampling.stop == (".",)
    for parse, body in ((parse_workers_ai, {"prompt": "hi", "stop": ["s"] * 17}),
                        (parse_chat_completions, {**CHAT, "stop": ["s"] * 5}),
                        (parse_workers_ai, {"prompt": "hi", "stop": [""]})):
        with pytest.raises(InvalidInput) as caught:
            parse(body)
        assert caught.value.param == "stop"


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("functions", [{"name": "f", "parameters": {"type": "object"}}], "tools"),
        ("response_format", {"type": "regex"}, "response_format"),
        ("tool_choice", "required", "tool"),  # without tools
        ("image", [1, 2, 3], "text only"),
        ("n", 2, "one per request"),
        ("logit_bias", {"50256": -100}, "bias"),
        ("max_completion_tokens", 9, "send max_tokens"),
        ("input", "hi", "messages"),
        ("min_p", 0.1, "sampler"),
        ("guided_regex", "[a-z]+", "response_format"),
        ("chat_template_kwargs", {"enable_thinking": True}, "template"),
        ("requests", [{"prompt": "a"}], "batch"),
        ("queueRequest", True, "batch"),
        ("max_token", 5, "did you mean max_tokens?"),  # misspelt: would otherwise run with 256 tokens
        ("maxTokens", 5, "did you mean max_tokens?"),
        ("temprature", 0.1, "did you mean temperature?"),
        ("stop_sequence", ["x"], "stop_sequences is Anthropic's name: send stop"),
    ],
)
def test_workers_ai_refuses_what_would_change_the_answer(field: str, value: Any, words: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_workers_ai({"prompt": "hi", field: value})
    assert caught.value.param == field and caught.value.message.startswith(field) and words in caught.value.message


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("response_format", {"type": "json_schema", "json_schema": {"type": "object"}}),  # no name: not OpenAI's
        ("tools", [{"type": "function", "function": {"name": ""}}]),
        ("tool_choice", "required"),
        ("tool_choice", {"type": "function", "function": {"name": "f"}}),
        ("function_call", "auto"),
        ("logit_bias", {"50256": -100}),
        ("top_logprobs", 2),
        ("modalities", ["text", "audio"]),
        ("reasoning_effort", "high"),
        ("guided_json", {"type": "object"}),
        ("raw", True),
        ("prompt", "hi"),
        ("max_tokns", 3),
        ("stream_option", {"include_usage": True}),
    ],
)
def test_chat_refuses_what_would_change_the_answer(field: str, value: Any) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_chat_completions({**CHAT, field: value})
    assert caught.value.param == field and field in caught.value.message


@pytest.mark.parametrize(("field", "value"), [("echo", True), ("suffix", "end"), ("best_of", 3), ("tools", [TOOL])])
def test_completions_refuse_what_would_change_the_answer(field: str, value: Any) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_completions({"model": "m", "prompt": "x", field: value})
    assert caught.value.param == field


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [("max_tokens", 5, "send max_output_tokens"), ("response_format", {"type": "json_object"}, "text.format"),
     ("messages", MESSAGES, "send prompt"), ("max_token", 5, "max_tokens is the chat name")],
)
def test_responses_refuse_what_would_change_the_answer(field: str, value: Any, words: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_responses({"model": "m", "input": "x", field: value})
    assert caught.value.param == field and words in caught.value.message


@pytest.mark.parametrize(
    "extra",
    [{"frobnicate": True}, {"metadata": {"job": "x"}}, {"user": "u"}, {"model": "@cf/meta/llama-3.1-8b-instruct"},
     {"stream_options": {"include_usage": True}}, {"top_n": 3}, {"cf-aig-cache-ttl": 60}],
)
def test_workers_ai_ignores_unknown_fields_that_cannot_change_the_answer(extra: dict[str, Any]) -> None:
    assert parse_workers_ai({"prompt": "hi", **extra}) == parse_workers_ai({"prompt": "hi"})


def test_openai_routes_ignore_unknown_fields_too() -> None:
    assert parse_chat_completions({**CHAT, "frobnicate": 1, "x_client": "y"}) == parse_chat_completions(CHAT)
    assert parse_completions({"model": "m", "prompt": "x", "frobnicate": 1}).prompt.text == "x"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("response_format", {"type": "text"}),
        ("tools", []),
        ("tool_choice", "none"),
        ("modalities", ["text"]),
        ("logit_bias", {}),
        ("user", "end-user-7"),
        ("metadata", {"job": "nightly"}),
        ("store", False),
        ("parallel_tool_calls", False),
        ("response_format", {"type": "json_object"}),
        ("response_format", JSON_SCHEMA),
        ("tools", [TOOL]),
        ("prompt_cache_key", "conversation-1"),
    ],
)
def test_no_op_values_honoured_and_harmless_fields_pass(field: str, value: Any) -> None:
    assert parse_chat_completions({**CHAT, field: value}).prompt.messages[-1] == {"role": "user", "content": "hi"}


def test_the_clients_usual_fields_all_pass() -> None:
    """What the openai and cloudflare SDKs send for ordinary text generation when asked to."""
    sampling = {"max_tokens": 8, "temperature": 0.5, "top_p": 0.9, "seed": 3, "presence_penalty": 0.1}
    parse_chat_completions({**CHAT, **sampling, "stream": True, "stream_options": {"include_usage": True},
                            "stop": ["\n"], "n": 1, "logprobs": False, "max_completion_tokens": 8, "user": "u"})
    parse_completions({"model": "m", "prompt": "x", **sampling, "stream": False, "echo": False, "best_of": 1})
    parse_workers_ai({"prompt": "x", **sampling, "top_k": 5, "repetition_penalty": 1.1, "frequency_penalty": 0.1,
                      "raw": False, "stream": False, "n": 1, "lora": None})


def test_options_reject_if_busy_on_every_generation_route() -> None:
    busy = {"options": {"rejectIfBusy": True}}
    assert parse_workers_ai({"messages": MESSAGES, **busy}).reject_if_busy
    assert parse_chat_completions({**CHAT, **busy}).reject_if_busy
    assert parse_completions({"model": "m", "prompt": "x", **busy}).reject_if_busy
    assert parse_responses({"model": "m", "input": "x", **busy}).generation.reject_if_busy
    for options in (None, {}, {"rejectIfBusy": False}, {"rejectIfBusy": None}, {"gateway": {"id": "g"}}):
        assert not parse_workers_ai({"prompt": "hi", "options": options}).reject_if_busy


@pytest.mark.parametrize(
    ("options", "param", "words"),
    [
        ("busy", "options", "must be an object"),
        ({"rejectIfBusy": "yes"}, "options.rejectIfBusy", "true or false"),
        ({"reject_if_busy": True}, "options.reject_if_busy", "did you mean rejectIfBusy?"),
        ({"queueRequest": True}, "options.queueRequest", "batch"),
    ],
)
def test_options_follow_the_field_rule(options: Any, param: str, words: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_workers_ai({"prompt": "hi", "options": options})
    assert caught.value.param == param and words in caught.value.message


def test_every_published_workers_ai_field_is_honoured_or_refused_never_ignored() -> None:
    """Against Workers AI's published input schemas: a field a client may send is acted on or refused."""
    for name in PUBLISHED_TEXT_GENERATION:
        rule = WORKERS_AI.get(name) or GENERATION_REFUSED[name]
        assert rule.treatment is not Treatment.IGNORED, name
    for name in PUBLISHED_EMBEDDINGS:
        rule = WORKERS_AI_EMBEDDINGS.get(name) or EMBEDDINGS_REFUSED[name]
        assert rule.treatment is not Treatment.IGNORED, name


def test_every_ignored_or_refused_field_says_why() -> None:
    tables = (WORKERS_AI, OPENAI_CHAT, OPENAI_COMPLETIONS, OPENAI_RESPONSES, WORKERS_AI_EMBEDDINGS, OPENAI_EMBEDDINGS,
              GENERATION_REFUSED, EMBEDDINGS_REFUSED, OPTIONS)
    for table in tables:
        for name, rule in table.items():
            assert rule.treatment is Treatment.HONOURED or rule.reason, name


def test_embedding_bodies() -> None:
    assert parse_workers_ai_embedding({"text": "a"}) == ("a",)
    assert parse_workers_ai_embedding({"text": "a", "pooling": "mean", "prompt": "b", "options": {}}) == ("a",)
    assert parse_openai_embedding({"model": "m", "input": ["a", "b"], "user": "u"}) == (("a", "b"), "float")
    assert parse_openai_embedding({"model": "m", "input": "a", "encoding_format": "base64"})[1] == "base64"
    for body, field in [
        ({"text": ["a"] * 101}, "text"),
        ({"text": [""]}, "text"),
        ({"text": "a", "pooling": "cls"}, "pooling"),
        ({"text": "a", "requests": [{"text": "b"}]}, "requests"),
        ({"text": "a", "txt": "b"}, "txt"),
    ]:
        with pytest.raises(InvalidInput) as caught:
            parse_workers_ai_embedding(body)
        assert caught.value.param == field
    for body, field in [
        ({"model": "m", "input": "a", "dimensions": 64}, "dimensions"),
        ({"model": "m", "input": "a", "encoding_format": "int8"}, "encoding_format"),
        ({"model": "m", "input": [1, 2]}, "input"),
    ]:
        with pytest.raises(InvalidInput) as caught:
            parse_openai_embedding(body)
        assert caught.value.param == field
