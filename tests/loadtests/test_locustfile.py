"""Locust smoke runs: the locustfile as a headless subprocess against a real gateway and backend."""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from cli.processes import ROOT
from loadtests import run_locust
from loadtests.stack import Stack

pytestmark = pytest.mark.slow
LOCUSTFILE = str(ROOT / "loadtests" / "locustfile.py")


def rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def test_headless_run_records_requests_and_custom_metrics(stack: Stack, tmp_path: Path) -> None:
    command = [
        sys.executable, "-m", "locust", "-f", LOCUSTFILE, "--headless", "-u", "2", "-r", "2", "-t", "5s",
        "--stop-timeout", "30s", "--host", stack.url, "--csv", str(tmp_path / "run"),
        "--html", str(tmp_path / "run.html"),
        "--only-summary", f"--edgerun-admin-token={stack.admin_token}", "--edgerun-max-tokens", "8",
        "--edgerun-agent-turns", "2-3", "--edgerun-summary", str(tmp_path / "summary.json"),
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    stats = {(r["Type"], r["Name"]): r for r in rows(tmp_path / "run_stats.csv")}
    requests = [r for (kind, _), r in stats.items() if kind == "POST"]
    assert requests and sum(int(r["Request Count"]) for r in requests) >= 1, done.stderr[-3000:]
    assert all(r["Failure Count"] == "0" for r in stats.values())
    assert rows(tmp_path / "run_failures.csv") == []
    ttft = [r for (kind, _), r in stats.items() if kind == "TTFT"]
    assert ttft and int(ttft[0]["Request Count"]) >= 1 and float(ttft[0]["Median Response Time"]) > 0
    assert [kind for kind, _ in stats if kind == "ITL"]
    assert ("CACHE", "cached_tokens_pct") in stats
    assert "TTFT" in (tmp_path / "run.html").read_text()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["tenants"] == ["acme", "globex", "initech"]
    assert summary["requests_with_usage"] >= 1 and summary["prompt_tokens"] > 0
    assert 0.0 <= summary["cached_token_ratio"] <= 1.0 and summary["errors_by_code"] == {}


def test_without_credentials_the_run_stops_with_a_clear_error() -> None:
    command = [sys.executable, "-m", "locust", "-f", LOCUSTFILE, "--headless", "-u", "1", "-r", "1", "-t", "5s",
               "--host", "http://127.0.0.1:9", "--only-summary"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "give --edgerun-admin-token" in done.stderr


def test_make_loadtest_runs_the_locustfile_bounded_and_headless(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    run_locust.add_arguments(parser)
    args = parser.parse_args(["-u", "3", "-t", "10s", "--out", str(tmp_path), "--", "--loglevel", "WARNING"])
    command = run_locust.locust_command("http://127.0.0.1:1234", "tok", args)
    assert command[command.index("-f") + 1] == LOCUSTFILE and "--headless" in command
    assert command[command.index("-u") + 1] == "3" and command[command.index("-t") + 1] == "10s"
    assert command[command.index("--host") + 1] == "http://127.0.0.1:1234"
    assert command[command.index("--csv") + 1] == str(tmp_path / "locust")
    assert "--edgerun-admin-token=tok" in command
    assert command[-2:] == ["--loglevel", "WARNING"]


# Locust's own parsers on a command; run apart, since importing locust monkey-patches the process (gevent)
PARSE_AS_LOCUST = """
import sys
import loadtests.locustfile  # registers the --edgerun-* options
from locust.argument_parser import get_parser, parse_locustfile_option
args = sys.argv[1:]
parse_locustfile_option(args)
print(get_parser().parse_args(args).edgerun_admin_token)
"""


def test_an_admin_token_that_starts_with_a_dash_reaches_the_locustfile(tmp_path: Path) -> None:
    """secrets.token_urlsafe starts a token with "-" about once in 64: as its own argument Locust read it as a flag."""
    parser = argparse.ArgumentParser()
    run_locust.add_arguments(parser)
    token = "-Xq3" + "a" * 39
    command = run_locust.locust_command("http://127.0.0.1:1234", token, parser.parse_args(["--out", str(tmp_path)]))
    arguments = command[command.index("-f"):]  # what Locust parses: everything after `python -m locust`
    done = subprocess.run([sys.executable, "-c", PARSE_AS_LOCUST, *arguments], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == token
