"""`edgerun simulate` (cli/simulate.py) through the real `edgerun` dispatcher."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.main import main


def test_simulate_prints_a_table_and_writes_json(
    trace_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sim.json"
    argv = ["simulate", "--trace", str(trace_path), "--limit", "400", "--backends", "4", "--json", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "400 requests; 4 backends x" in printed
    names = ["round_robin", "least_tokens", "session_hash", "prefix_threshold", "cache_aware"]
    for name in names:
        assert f"| {name} | exact |" in printed
    data = json.loads(out.read_text())
    assert [r["policy"] for r in data["results"]] == names
    assert data["config"]["num_backends"] == 4
    assert all(r["num_requests"] == 400 for r in data["results"])


def test_one_policy_with_a_parameter(trace_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--trace", str(trace_path), "--limit", "100", "--policy", "cache_aware"]
    argv += ["--param", "cache_aware.eps=0.5"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "| cache_aware |" in printed and "| round_robin |" not in printed


def test_replicas_are_simulated(trace_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--trace", str(trace_path), "--limit", "200", "--policy", "cache_aware", "--replicas", "4"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "4 gateway replicas polling every 1 s" in printed and "| cache_aware | 4 |" in printed
    assert main([*argv[:-1], "0"]) == 2
    assert "replicas=0 must be >= 1" in capsys.readouterr().err


def test_bad_inputs_exit_2_with_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\nnot json\n')
    assert main(["simulate", "--trace", str(bad)]) == 2
    assert f"{bad}:2: not JSON" in capsys.readouterr().err
    assert main(["simulate", "--trace", str(tmp_path / "missing.jsonl")]) == 2
    assert main(["simulate", "--trace", str(bad), "--limit", "1", "--param", "cache_aware.nope=1"]) == 2
    assert "no parameter 'nope'" in capsys.readouterr().err
    assert main(["simulate", "--trace", str(bad), "--limit", "1", "--param", "oops"]) == 2


def test_tiers_compared_with_sizes_relative_to_the_pool(
    trace_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "tiers.json"
    argv = ["simulate", "--trace", str(trace_path), "--limit", "300", "--policy", "round_robin"]
    argv += ["--kv-blocks-per-backend", "100", "--host-tier-blocks", "2x", "--region-pool-blocks", "9000"]
    assert main([*argv, "--tiers", "compare", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "tiers: host 200 blocks per backend (200000 tok/s), regional pool 9000 blocks (90000 tok/s)" in printed
    assert "| policy | % of ceiling: no tiers / tiers |" in printed
    data = json.loads(out.read_text())
    assert data["config"]["host_tier_blocks_per_backend"] == 200 and data["config"]["region_pool_blocks"] == 9000
    [without], [with_tiers] = data["results_without_tiers"], data["results"]
    assert with_tiers["share_of_ceiling"] == 1.0 > without["share_of_ceiling"]  # the pool holds the whole slice
    assert with_tiers["region_hit_blocks"] > 0 and without["region_hit_blocks"] == 0
    assert main([*argv, "--tiers", "off"]) == 0
    assert "tiers:" not in capsys.readouterr().out
    assert main([*argv[:-1], "lots"]) == 2
    assert "tier size 'lots'" in capsys.readouterr().err
