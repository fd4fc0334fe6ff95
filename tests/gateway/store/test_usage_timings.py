"""A usage record's latency fields (ttft_s, itl_s) are optional: both stores keep them, and records
written before they existed still read back (with None)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from gateway.store import InvalidArgument, Store, UsageRecord
from tests.gateway.store.test_ledger import T0, record


async def test_timings_round_trip_and_old_records_read_as_none(store: Store) -> None:
    timed = record("req-timed", T0, ttft_s=0.123456, itl_s=0.0215)
    assert await store.append_usage(timed)
    assert await store.get_usage("req-timed") == timed
    untimed = record("req-untimed", T0 + 1)
    assert await store.append_usage(untimed)
    assert (await store.get_usage("req-untimed")).ttft_s is None  # type: ignore[union-attr]


def test_a_record_written_before_the_fields_existed_still_parses() -> None:
    fields = dataclasses.asdict(record("req-old", T0))
    del fields["ttft_s"], fields["itl_s"]
    old = UsageRecord.from_json(json.dumps(fields))
    assert old.ttft_s is None and old.itl_s is None and old.prompt_tokens == 120


@pytest.mark.parametrize("value", [-0.1, float("inf"), float("nan"), "0.2"])
def test_timings_must_be_finite_seconds(value: object) -> None:
    with pytest.raises(InvalidArgument, match="ttft_s"):
        record("req-bad", T0, ttft_s=value)


def test_a_record_encodes_every_field_sorted_and_compact_and_reads_back() -> None:
    timed = record("req-json", T0, ttft_s=0.5, itl_s=0.01)
    text = timed.to_json()
    assert text == json.dumps(dataclasses.asdict(timed), separators=(",", ":"), sort_keys=True)
    assert UsageRecord.from_json(text) == timed
