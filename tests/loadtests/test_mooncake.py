from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtests.bench.mooncake import (
    DEFAULT_TRACE,
    TraceError,
    TraceRecord,
    TraceScale,
    read_trace,
    reusable_block_ratio,
    scale_request,
    scaled_trace,
    select,
)


def test_the_full_trace_has_the_published_reuse_ceiling() -> None:
    records = read_trace(DEFAULT_TRACE)
    assert len(records) == 3993
    assert reusable_block_ratio(records) == pytest.approx(0.640, abs=0.0005)  # ../shared/data/README.md


def test_shared_hash_ids_become_a_shared_text_prefix() -> None:
    scale = TraceScale(block_tokens=4, max_blocks=3)
    a = scale_request(TraceRecord(0, 3 * 512, 10, (1, 2, 3)), scale, 0)
    b = scale_request(TraceRecord(2000, 3 * 512, 10, (1, 2, 9)), scale, 0)
    c = scale_request(TraceRecord(0, 3 * 512, 10, (5, 2, 3)), scale, 0)
    shared = len(a.prompt.split()) * 2 // 3
    assert a.prompt.split()[:shared] == b.prompt.split()[:shared]
    assert a.prompt.split()[-4:] != b.prompt.split()[-4:]
    assert a.prompt.split()[:4] != c.prompt.split()[:4]
    assert b.arrival_s == pytest.approx(2.0 * scale.time_scale)


def test_lengths_are_scaled_and_capped() -> None:
    scale = TraceScale(block_tokens=16, max_blocks=4, output_scale=0.25, max_output_tokens=16)
    short = scale_request(TraceRecord(0, 512 + 128, 20, (1, 2)), scale, 0)
    assert short.num_prompt_tokens == 16 + 4  # the last block is a quarter full
    assert len(short.prompt.split()) == short.num_prompt_tokens
    assert short.max_tokens == 5
    long = scale_request(TraceRecord(0, 40 * 512, 900, tuple(range(40))), scale, 0)
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


def test_bad_trace_lines_are_refused_with_their_line_number(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n{"timestamp": 1}\n')
    with pytest.raises(TraceError, match="bad.jsonl:2"):
        read_trace(path)
    with pytest.raises(TraceError, match="cannot read"):
        read_trace(tmp_path / "missing.jsonl")
