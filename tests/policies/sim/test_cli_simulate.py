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
