from __future__ import annotations

import json

import pytest

from loadtests.workers_ai import SSEDecoder, StreamTrace, Usage, error_from_body, run_path

USAGE = {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13, "prompt_tokens_details": {"cached_tokens": 8}}


def test_decoder_reassembles_events_split_anywhere() -> None:
    stream = b'data: {"response": "Hi", "p": "x"}\n\ndata: {"response": " there"}\r\n\r\ndata: [DONE]\n\n'
    decoder = SSEDecoder()
    payloads = [p for i in range(0, len(stream), 7) for p in decoder.feed(stream[i:i + 7])]
    assert payloads == ['{"response": "Hi", "p": "x"}', '{"response": " there"}', "[DONE]"]


def test_trace_times_chunks_and_reads_usage() -> None:
    trace = StreamTrace(sent_at=100.0)
    for t, text in ((100.5, "a"), (100.6, "b"), (100.8, "c")):
        trace.on_payload(json.dumps({"response": text, "p": "pad"}), t)
    trace.on_payload(json.dumps({"response": "", "usage": USAGE}), 100.81)
    trace.on_payload("[DONE]", 100.9)
    trace.finish(101.0)
    assert trace.ok and trace.text == "abc"
    assert trace.ttft_s == pytest.approx(0.5)
    assert trace.itls_s == pytest.approx([0.1, 0.2])
    assert trace.e2e_s == pytest.approx(0.9)
    assert trace.tpot_s == pytest.approx((0.9 - 0.5) / 2)
    assert trace.usage == Usage(10, 3, 8)


def test_a_stream_error_event_carries_its_code() -> None:
    trace = StreamTrace(sent_at=0.0)
    trace.on_payload(json.dumps({"response": "a", "p": ""}), 1.0)
    trace.on_payload(json.dumps({"response": "", "errors": [{"code": 3007, "message": "timeout"}]}), 2.0)
    trace.finish(3.0)
    assert not trace.ok
    assert trace.error is not None and trace.error.code == 3007


def test_a_stream_cut_short_is_an_error() -> None:
    trace = StreamTrace(sent_at=0.0)
    trace.on_payload(json.dumps({"response": "a", "p": ""}), 1.0)
    trace.finish(2.0)
    assert not trace.ok and trace.error is not None and trace.error.code == 0


def test_error_envelopes_and_bare_statuses() -> None:
    body = json.dumps({"result": None, "success": False, "errors": [{"code": 3040, "message": "busy"}]}).encode()
    error = error_from_body(429, body)
    assert (error.code, error.message) == (3040, "busy")
    assert error_from_body(502, b"<html>bad gateway</html>").code == 502


def test_run_path() -> None:
    assert run_path("acct") == "/client/v4/accounts/acct/ai/run/@cf/huggingface/smollm2-135m-instruct"
