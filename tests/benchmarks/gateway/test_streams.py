"""benchmarks/gateway/streams.py end to end: a slow stub, `edgerun serve`, streams from two client
processes on several source addresses, every one read to `[DONE]`, and the report table."""

from __future__ import annotations

import pytest

from benchmarks.gateway.streams import StreamResult, main, max_open, source_addresses


def test_source_addresses_take_turns_of_per_address() -> None:
    assert source_addresses(5, 2) == ["127.0.0.2", "127.0.0.2", "127.0.0.3", "127.0.0.3", "127.0.0.4"]
    assert source_addresses(300, 1)[-1] == "127.0.1.45"  # 2 + 299 = 301 = 1 * 256 + 45


def test_max_open_counts_overlapping_streams() -> None:
    def stream(start: float, end: float) -> StreamResult:
        return StreamResult(200, "", 3, True, start, start, end, 0.0)

    assert max_open([stream(0, 2), stream(1, 3), stream(2.5, 4), stream(5, 6)]) == 2


@pytest.mark.slow
def test_short_run_holds_every_stream(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--streams", "40", "--hold", "1", "--chunks", "3", "--clients", "2", "--per-address", "8"]) == 0
    out = capsys.readouterr().out
    rows = {
        cells[0]: cells[1]
        for cells in (line.strip("| ").split(" | ") for line in out.splitlines() if line.startswith("| "))
    }
    assert rows["streams opened / completed with [DONE]"] == "40 / 40"
    assert rows["failures"] == "none"
