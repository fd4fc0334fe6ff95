from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtests.bench.mooncake import (
    DEFAULT_TRACE,
    TraceError,
    TraceScale,
    group_of,
    read_trace,
    reusable_block_ratio,
    scale_request,
    scaled_trace,
    select,
)
from policies.sim import trace as sim_trace
from policies.sim.trace import TraceRequest


def test_the_full_trace_has_the_published_reuse_ceiling() -> None:
    records = read_trace(DEFAULT_TRACE)
    assert len(records) == 3993
    assert reusable_block_ratio(records) == pytest.approx(0.640, abs=0.0005)  # data/README.md


def test_shared_hash_ids_become_a_shared_text_prefix() -> None:
    scale = TraceScale(block_tokens=4, max_blocks=3)
    a = scale_request(TraceRequest(0, 3 * 512, 10, (1, 2, 3)), scale, 0)
    b = scale_request(TraceRequest(2000, 3 * 512, 10, (1, 2, 9)), scale, 0)
    c = scale_request(TraceRequest(0, 3 * 512, 10, (5, 2, 3)), scale, 0)
    shared = len(a.prompt.split()) * 2 // 3
    assert a.prompt.split()[:shared] == b.prompt.split()[:shared]
    assert a.prompt.split()[-4:] != b.prompt.split()[-4:]
    assert a.prompt.split()[:4] != c.prompt.split()[:4]
    assert b.arrival_s == pytest.approx(2.0 * scale.time_scale)


def test_lengths_are_scaled_and_capped() -> None:
    scale = TraceScale(block_tokens=16, max_blocks=4, output_scale=0.25, max_output_tokens=16)
    short = scale_request(TraceRequest(0, 512 + 128, 20, (1, 2)), scale, 0)
    assert short.num_prompt_tokens == 16 + 4  # the last block is a quarter full
    assert len(short.prompt.split()) == short.num_prompt_tokens
    assert short.max_tokens == 5
    long = scale_request(TraceRequest(0, 40 * 512, 900, tuple(range(40))), scale, 0)
    assert long.num_prompt_tokens == 4 * 16 and long.max_tokens == 16


def test_select_keeps_whole_groups_with_repeats(tmp_path: Path) -> None:
    rows = [(0, [1, 2]), (10, [3]), (20, [1, 2, 4]), (30, [5, 6]), (40, [5]), (50, [7, 8]), (60, [7])]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps({"timestamp": t, "input_length": 512 * len(h), "output_length": 4,
                                          "hash_ids": h}) for t, h in rows))
    records = read_trace(path)
    chosen = select(records, TraceScale(num_groups=2, min_group_requests=2))
    assert [r.timestamp_ms for r in chosen] == [0, 20, 30, 40]
    requests = scaled_trace(records, TraceScale(num_groups=2, time_scale=1.0))
    assert [r.arrival_s for r in requests] == [0.0, 0.02, 0.03, 0.04]


def test_the_ceiling_counts_leading_blocks_seen_before_within_max_blocks() -> None:
    records = [TraceRequest(t, 512 * len(ids), 1, ids) for t, ids in
               [(0, (1, 2, 3)), (1, (1, 2, 4)), (2, (1, 2, 3, 5)), (3, (6,)), (4, (7, 1, 2))]]
    # 0 + 2 ([1, 2]) + 3 ([1, 2, 3]) + 0 + 0 (1, 2 again, but after 7), out of 3 + 3 + 4 + 1 + 3
    assert reusable_block_ratio(records) == pytest.approx(5 / 14)
    # cut to 2 blocks: 0 + 2 + 2 + 0 + 0 out of 2 + 2 + 2 + 1 + 2
    assert reusable_block_ratio(records, max_blocks=2) == pytest.approx(4 / 9)
    assert group_of(records[4]) == 7


def test_bad_trace_lines_are_refused_with_their_line_number(tmp_path: Path) -> None:
    good = '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}'
    path = tmp_path / "bad.jsonl"
    for bad, why in [('{"timestamp": 1}', "hash_ids"), ("{nope", "not JSON"), ("[1, 2]", "expected a JSON object"),
                     ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": []}', "non-empty")]:
        path.write_text(f"{good}\n\n{bad}\n")
        with pytest.raises(TraceError, match=f"bad.jsonl:3: .*{why}") as refused:
            read_trace(path)
        assert isinstance(refused.value, sim_trace.TraceError)  # the simulator's except catches it too
    with pytest.raises(TraceError, match="cannot read"):
        read_trace(tmp_path / "missing.jsonl")
