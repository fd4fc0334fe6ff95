"""What makes two requests the same entry (gateway/pipeline/answer_cache.py), and the kept answer's format."""

from __future__ import annotations

from contracts.usage import Usage
from gateway.pipeline.answer_cache import MAX_TTL_S, CacheDirective, cache_key, clamp_ttl
from gateway.pipeline.replay import CachedAnswer
from gateway.pipeline.schemas import parse_chat_completions, parse_workers_ai

MODEL = "@cf/huggingface/smollm2-135m-instruct"
MESSAGES = [{"role": "user", "content": "hi"}]


def chat_key(**fields: object) -> str:
    return cache_key("chat", MODEL, parse_chat_completions({"model": MODEL, "messages": MESSAGES, **fields}))


def test_encoding_and_defaults_do_not_change_the_key() -> None:
    plain = chat_key()
    assert chat_key(stream=True, stream_options={"include_usage": True}) == plain
    assert chat_key(options={"rejectIfBusy": True}) == plain
    assert chat_key(temperature=0.6, max_tokens=256, stop=None) == plain  # the defaults, and a null
    assert chat_key(max_completion_tokens=256) == plain


def test_what_changes_the_answer_changes_the_key() -> None:
    plain = chat_key()
    others = [chat_key(temperature=0.7), chat_key(seed=3), chat_key(max_tokens=5), chat_key(stop=["x"]),
              chat_key(messages=[{"role": "user", "content": "hi!"}]),
              chat_key(response_format={"type": "json_object"}),
              cache_key("chat", "@cf/other/model", parse_chat_completions({"model": MODEL, "messages": MESSAGES})),
              cache_key("run", MODEL, parse_workers_ai({"messages": MESSAGES}))]  # another route
    assert len({plain, *others}) == len(others) + 1


def test_a_named_entry_ignores_the_request() -> None:
    run = parse_workers_ai({"prompt": "a"})
    assert cache_key("run", MODEL, run, "k") == cache_key("chat", "@cf/x/y", parse_workers_ai({"prompt": "b"}), "k")
    assert cache_key("run", MODEL, run, "k") != cache_key("run", MODEL, run, "k2")


def test_ttls_and_what_a_directive_does() -> None:
    assert (clamp_ttl(1), clamp_ttl(3600), clamp_ttl(10**9)) == (60, 3600, MAX_TTL_S)
    assert (CacheDirective(3600).may_read, CacheDirective(3600).keep_s) == (True, 3600)
    assert (CacheDirective(None, key="k").keep_s, CacheDirective(None, key="k").may_read) == (300, True)
    assert (CacheDirective(None, skip=True).keep_s, CacheDirective(None, skip=True).may_read) == (None, False)
    assert (CacheDirective(3600, skip=True).keep_s, CacheDirective(3600, skip=True).may_read) == (3600, False)


def test_a_kept_answer_reads_back_and_a_foreign_one_is_ignored() -> None:
    answer = CachedAnswer(("Hel", "lo ", "wörld"), "stop", Usage(12, 3, 8))
    assert CachedAnswer.from_json(answer.to_json()) == answer
    for foreign in ("", "[]", '{"v": 2}', '{"v": 1, "deltas": [1], "finish_reason": null, "usage": [1, 1, 0]}',
                    '{"v": 1, "deltas": [], "finish_reason": "stop", "usage": [1, 1, 5]}'):
        assert CachedAnswer.from_json(foreign) is None, foreign


def test_a_finetunes_answers_are_its_own() -> None:
    chat = parse_chat_completions({"model": MODEL, "messages": MESSAGES})
    keys = {cache_key("chat", MODEL, chat), cache_key("chat", MODEL, chat, adapter="ft-1"),
            cache_key("chat", MODEL, chat, adapter="ft-2"), cache_key("chat", MODEL, chat, "k", "ft-1"),
            cache_key("chat", MODEL, chat, "k")}
    assert len(keys) == 5
    by_name = parse_workers_ai({"messages": MESSAGES, "lora": "french"})
    by_id = parse_workers_ai({"messages": MESSAGES, "lora": "ft-1"})
    assert cache_key("run", MODEL, by_name, adapter="ft-1") == cache_key("run", MODEL, by_id, adapter="ft-1")
