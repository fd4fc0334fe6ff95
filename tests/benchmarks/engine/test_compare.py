"""benchmarks/engine/compare.py: the streams measured again without edgerun's kernels, in a child process."""

from __future__ import annotations

import argparse

import pytest

from benchmarks.engine.compare import KernelsOffStreams
from benchmarks.engine.report import kernels_off_rows


@pytest.mark.process
def test_the_kernels_off_child_runs_a_round_of_streams_per_request() -> None:
    args = argparse.Namespace(streams=2, tokens=4, num_kv_blocks=64, set=["model=random:tiny", "weight_dtype=float32"])
    with KernelsOffStreams(args) as child:
        rounds = [child.round(), child.round()]
    assert all(wall > 0 and cpu > 0 for wall, cpu in rounds)
    assert child.process.returncode == 0  # stdin closed: the child leaves its loop and exits


def test_the_report_shows_kernels_on_against_off_and_flags_a_loss() -> None:
    ours = {"streams_agg_tok_s": 190.0, "streams_cpu_ms_per_token": 10.0, "streams_rounds_tok_s": [190.0]}
    off = {"streams_agg_tok_s": 210.0, "streams_cpu_ms_per_token": 10.0, "rounds_tok_s": [210.0]}
    throughput, cpu = kernels_off_rows(ours, off, 16)
    assert throughput[1:4] == ("190.0", "210.0", "0.90x") and throughput[-1] == "**no**"  # the 8% would show
    assert cpu[3:] == ("1.00x", ">= 1.0x", "yes")
    assert kernels_off_rows(ours, {}, 16) == []  # --no-kernels-off
