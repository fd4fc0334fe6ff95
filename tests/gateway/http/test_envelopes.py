"""The JSON shapes every answer takes."""

from __future__ import annotations

import json

from contracts.usage import Usage
from gateway.errors import InvalidInput, NoSuchModel, RateLimited
from gateway.http.envelopes import (
    error_response,
    openai_error,
    workers_ai_error,
    workers_ai_success,
    workers_ai_text_result,
)


def test_usage_always_has_cached_tokens() -> None:
    assert Usage(10, 3, 4).as_dict() == {
        "prompt_tokens": 10,
        "completion_tokens": 3,
        "total_tokens": 13,
        "prompt_tokens_details": {"cached_tokens": 4},
    }


def test_workers_ai_success_and_error_envelopes() -> None:
    ok = workers_ai_success(workers_ai_text_result("hi", Usage(1, 1, 0)))
    assert ok["success"] is True and ok["errors"] == [] and ok["messages"] == []
    assert ok["result"]["response"] == "hi"
    error = workers_ai_error(NoSuchModel("No such model @cf/x or task"))
    assert error == {
        "result": None,
        "success": False,
        "errors": [{"code": 5007, "message": "No such model @cf/x or task"}],
        "messages": [],
    }


def test_openai_error_shape() -> None:
    assert openai_error(InvalidInput("top_p is bad", param="top_p")) == {
        "error": {"message": "top_p is bad", "type": "invalid_request_error", "param": "top_p", "code": "5004"}
    }


def test_error_response_status_and_retry_after() -> None:
    response = error_response(RateLimited("slow down", retry_after_s=2.2), openai=False)
    assert response.status_code == 429
    assert response.headers["retry-after"] == "3"  # rounded up, never 0
    assert json.loads(response.body)["errors"][0]["code"] == 3040
