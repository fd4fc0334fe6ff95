"""The batch API's bodies and answers (gateway/pipeline/batch.py): which calls are batch calls, items
checked as their own requests (the index named), references kept, answers in order with summed usage."""

from __future__ import annotations

import json

import pytest

from gateway.errors import InvalidInput, OutOfCapacity
from gateway.fleet.catalog import EMBEDDING_TASK, ModelSpec
from gateway.pipeline.batch import (
    Item,
    answered,
    batch_call,
    batch_id_or_none,
    batch_result,
    failed,
    generation_input,
    parse_items,
    queue_flag,
)
from gateway.store.queue import BatchState

TEXT = ModelSpec(id="@cf/test/text", backend_model="m")
EMBED = ModelSpec(id="@cf/test/embed", backend_model="e", task=EMBEDDING_TASK)


def test_which_calls_are_batch_calls() -> None:
    assert queue_flag("true") and queue_flag("True") and queue_flag("1")
    assert not queue_flag(None) and not queue_flag("false")
    assert batch_call({"request_id": "x"}, False) == "poll"
    assert batch_call({"request_id": "x"}, True) == "poll"
    assert batch_call({"requests": [], "queueRequest": True}, False) == "enqueue"
    assert batch_call({"requests": []}, True) == "enqueue"
    assert batch_call({"requests": []}, False) is None  # refused by name as an ordinary request's field
    assert batch_call({"prompt": "hi", "request_id": None}, False) is None


def test_items_are_checked_as_their_own_requests() -> None:
    items = parse_items({"requests": [{"prompt": "a", "external_reference": "r1"}, {"messages": [
        {"role": "user", "content": "b"}], "max_tokens": 4, "external_reference": 7}], "queueRequest": True}, TEXT, 10)
    assert items == (Item({"prompt": "a"}, "r1"), Item({"messages": [{"role": "user", "content": "b"}],
                                                       "max_tokens": 4}, 7))
    assert Item.from_json(items[1].to_json()) == items[1]
    inp = generation_input(items[1])
    assert inp.reject_if_busy and not inp.stream and inp.sampling.max_tokens == 4
    assert parse_items({"requests": [{"text": ["x", "y"]}]}, EMBED, 10) == (Item({"text": ["x", "y"]}),)
    for body, model, param, words in [
        ({"requests": []}, TEXT, "requests", "non-empty array"),
        ({"requests": "no"}, TEXT, "requests", "non-empty array"),
        ({"requests": [{"prompt": "a"}] * 3}, TEXT, "requests", "at most 2 requests"),
        ({"requests": [{"prompt": "a"}, "b"]}, TEXT, "requests[1]", "must be a request object"),
        ({"requests": [{"prompt": "a"}, {"prompt": "b", "temperature": 9}]}, TEXT, "requests[1].temperature", ""),
        ({"requests": [{"prompt": "a", "stream": True}]}, TEXT, "requests[0].stream", "cannot stream"),
        ({"requests": [{"prompt": "a", "external_reference": {"x": 1}}]}, TEXT, "requests[0].external_reference", ""),
        ({"requests": [{"prompt": "a"}]}, EMBED, "requests[0].text", "text"),
        ({"requests": [{"prompt": "a"}], "queueRequest": "yes"}, TEXT, "queueRequest", "true or false"),
    ]:
        with pytest.raises(InvalidInput) as caught:
            parse_items(body, model, 2)
        assert caught.value.param == param and words in caught.value.message
        if param.startswith("requests["):
            assert caught.value.message.startswith(param.split(".")[0])


def test_answers_come_back_in_order_with_their_references_and_summed_usage() -> None:
    usage = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    results = (answered(0, "a", {"response": "x", "usage": usage}), failed(1, None, OutOfCapacity("busy")),
               answered(2, 3, {"shape": [1, 2], "data": [[0.1, 0.2]], "usage": {"prompt_tokens": 4,
                                                                               "total_tokens": 4}}))
    done = batch_result(BatchState("b", "@cf/test/text", "done", results), "alias")
    assert [r["id"] for r in done["responses"]] == [0, 1, 2]
    assert [r["external_reference"] for r in done["responses"]] == ["a", None, 3]
    assert done["responses"][1] == {"id": 1, "result": None, "success": False,
                                    "errors": [{"code": 3040, "message": "busy"}], "external_reference": None}
    assert done["usage"] == {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}
    assert json.loads(results[0])["success"] is True
    running = batch_result(BatchState("b", "@cf/test/text", "running", ()), "alias")
    assert running == {"status": "running", "request_id": "b", "model": "alias"}


def test_a_polled_id_that_cannot_name_a_batch_is_none() -> None:
    assert batch_id_or_none("768f15b7-4fd6-4498-906e-ad94ffc7f8d2") == "768f15b7-4fd6-4498-906e-ad94ffc7f8d2"
    assert batch_id_or_none("a:b") is None and batch_id_or_none(5) is None and batch_id_or_none("") is None
