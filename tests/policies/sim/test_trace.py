from __future__ import annotations

import dataclasses

import pytest

from policies.sim.trace import TraceError, TraceRequest, ceiling_hits, num_distinct_blocks, prepare


def req(ts: int, ids: list[int], n_in: int | None = None, n_out: int = 10) -> TraceRequest:
    return TraceRequest(ts, n_in or 512 * len(ids), n_out, tuple(ids))


def test_from_record_parses_the_mooncake_shape() -> None:
    r = TraceRequest.from_record({"timestamp": 27482, "input_length": 700, "output_length": 52, "hash_ids": [46, 47]})
    assert r == TraceRequest(27482, 700, 52, (46, 47))


@pytest.mark.parametrize(
    "record",
    [
        {"timestamp": 0, "input_length": 10, "output_length": 1},
        {"timestamp": "x", "input_length": 10, "output_length": 1, "hash_ids": [1]},
        {"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": []},
        {"timestamp": -1, "input_length": 10, "output_length": 1, "hash_ids": [1]},
    ],
)
def test_bad_records_are_refused_with_their_location(record: dict[str, object]) -> None:
    with pytest.raises(TraceError, match="line 7"):
        TraceRequest.from_record(record, "line 7")


@pytest.mark.parametrize(
    ("line", "why"),
    [("{nope", "not JSON"), ("[1]", "expected a JSON object"), ('{"timestamp": 0}', "needs integer timestamp")],
)
def test_from_line_parses_one_jsonl_line_or_says_where_it_is_bad(line: str, why: str) -> None:
    good = '{"timestamp": 5, "input_length": 700, "output_length": 52, "hash_ids": [46, 47]}\n'
    assert TraceRequest.from_line(good) == TraceRequest(5, 700, 52, (46, 47))
    with pytest.raises(TraceError, match=f"t.jsonl:3: {why}"):
        TraceRequest.from_line(line, "t.jsonl:3")


def test_prepare_sorts_and_derives_sessions_from_conversations() -> None:
    prepared = prepare([req(2000, [1, 2, 3]), req(1000, [1, 2]), req(1500, [9])])
    assert [r.arrival_s for r in prepared] == [1.0, 1.5, 2.0]
    assert prepared[0].session_id == prepared[2].session_id != prepared[1].session_id
    assert prepared[0].conversation == prepared[0].session_id
    assert {r.tenant for r in prepared} == {"trace"}
    assert prepared[2].block_hashes[:2] == prepared[0].block_hashes  # same leading ids, same hashes


def test_tenant_and_session_fields_are_optional_and_kept() -> None:
    record = {"timestamp": 5, "input_length": 700, "output_length": 52, "hash_ids": [46, 47]}
    plain = TraceRequest.from_record(record)
    tagged = TraceRequest.from_record({**record, "tenant": "acme", "session_id": "everything"})
    assert (plain.tenant, plain.session_id) == ("trace", None)
    assert TraceRequest.from_record(tagged.to_record()) == tagged and plain.to_record() == record
    a, b = prepare([tagged, dataclasses.replace(tagged, timestamp_ms=9, hash_ids=(1,))])
    assert a.session_id == b.session_id == "everything" and a.conversation != b.conversation
    with pytest.raises(TraceError, match="tenant"):
        TraceRequest.from_record({**record, "tenant": ""})


def test_same_ids_in_other_positions_do_not_share_hashes() -> None:
    a, b = prepare([req(0, [1, 2]), req(1, [1, 3, 2])])
    assert a.block_hashes[0] == b.block_hashes[0]
    assert a.block_hashes[1] not in b.block_hashes


def test_ceiling_counts_leading_blocks_seen_before() -> None:
    prepared = prepare([req(0, [1, 2, 3]), req(1, [1, 2, 4]), req(2, [1, 2, 3, 5]), req(3, [6])])
    # 0 + 2 ([1, 2]) + 3 ([1, 2, 3]) + 0, out of 3 + 3 + 4 + 1 blocks
    assert ceiling_hits(prepared) == (5, 11)
    assert num_distinct_blocks(prepared) == 6
