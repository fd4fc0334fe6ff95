"""`edgerun dev` (what `make run` starts): the printed curl command works as printed; SIGTERM (docker stop,
systemd, kill) stops the gateway and its backend; `edgerun billing export` afterwards, with no options
naming a store, exports what the run metered (the README's run-then-export path).

The run's HOME is a temporary directory, so the default store path lands there; its ~/.cache is the
real one (the converted model weights), so the model loads as fast as in any other test."""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from cli.processes import ROOT, child_env, free_port
from gateway.fleet.catalog import DEFAULT_MODEL_ID, EMBEDDING_MODEL_ID
from tests.process_tree import command_lines, gateway_pids

pytestmark = pytest.mark.slow


def user_env(home: Path) -> dict[str, str]:
    """A user's shell: HOME is `home` (its .cache the real one), no EDGERUN_* settings."""
    home.mkdir()
    (home / ".cache").symlink_to(Path.home() / ".cache", target_is_directory=True)
    return child_env({"HOME": str(home)}, keep_edgerun=False, threads=None)


def export(env: dict[str, str], out: Path) -> dict[str, Any]:
    """`edgerun billing export` of everything, with the default store of `env`'s HOME; its report."""
    done = subprocess.run(
        [sys.executable, "-m", "cli", "billing", "export", "--from", "2000-01-01", "--to", "2100-01-01",
         "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def test_make_run_prints_a_curl_that_works_sigterm_stops_all_then_export_bills_it(tmp_path: Path) -> None:
    port = free_port()
    env = user_env(tmp_path / "home")
    command = [sys.executable, "-m", "cli", "dev", "--port", str(port)]
    dev = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 240
        curl = None
        assert dev.stdout is not None
        while not lines or not lines[-1].startswith("Ctrl-C stops"):  # the banner's last line
            line = dev.stdout.readline()
            assert line or dev.poll() is None, "edgerun dev exited:\n" + "".join(lines)
            assert time.monotonic() < deadline, "no banner within 240s:\n" + "".join(lines)
            lines.append(line)
            if line.strip().startswith("curl "):
                curl = line.strip()
        assert curl is not None
        backend_url = re.search(r"-> backend (http://\S+)", "".join(lines))
        assert backend_url is not None

        answer = subprocess.run(shlex.split(curl), capture_output=True, text=True, timeout=120)
        assert answer.returncode == 0, answer.stderr
        body = json.loads(answer.stdout)
        assert body["success"] is True and body["result"]["response"]
        assert body["result"]["usage"]["completion_tokens"] > 0
        # the printed dashboard URL and admin token show the dev tenant's request
        printed = "".join(lines)
        admin_token = re.search(r"admin token: (\S+)", printed)
        dashboard = re.search(r"usage dashboard: (http://\S+/dashboard)", printed)
        assert admin_token is not None and dashboard is not None
        assert f"store: {tmp_path / 'home'}/" in printed  # the default path, which the export reads too
        assert httpx.get(dashboard.group(1), timeout=5).headers["content-type"].startswith("text/html")
        usage = httpx.get(
            f"{dashboard.group(1)}/api/usage", headers={"authorization": f"Bearer {admin_token.group(1)}"}, timeout=10
        ).json()
        assert {t["tenant_id"]: t["requests"] for t in usage["tenants"]}.get("dev", 0) >= 1
        # embeddings through the official openai SDK, at the printed OpenAI base URL
        embedding_url = re.search(r"embeddings \(backend (http://[^)\s]+)\)", printed)
        key = re.search(r"development key \(.*\): (\S+)", printed)
        assert embedding_url is not None and key is not None
        client = openai.OpenAI(api_key=key.group(1), base_url=f"http://127.0.0.1:{port}/client/v4/accounts/dev/ai/v1")
        vectors = client.embeddings.create(model=EMBEDDING_MODEL_ID, input=["the sea", "a lake"]).data
        assert [len(v.embedding) for v in vectors] == [384, 384]
        # the backend answers only its gateway: a random secret shared by the two for this run
        assert httpx.get(f"{backend_url.group(1)}/v1/models", timeout=5).status_code == 401
        assert httpx.get(f"{backend_url.group(1)}/health", timeout=5).status_code == 200

        dev.send_signal(signal.SIGTERM)  # what docker stop and systemd send (Ctrl-C's SIGINT takes the same path)
        code = dev.wait(timeout=60)
        for url in (backend_url.group(1), embedding_url.group(1)):
            with pytest.raises(httpx.ConnectError):  # the backend children are gone too, their ports free
                httpx.get(f"{url}/health", timeout=2)
        lines.append(dev.stdout.read())  # EOF only once the backends, which share the pipe, are gone
        assert code == 0

        # the README's next step, with the same defaults: the export holds the requests just made
        out = tmp_path / "bill.csv"
        assert export(env, out)["num_requests"] == 2  # the curl's and the embeddings'
        assert EMBEDDING_MODEL_ID in out.read_text() and DEFAULT_MODEL_ID in out.read_text()
    finally:
        if dev.poll() is None:
            dev.kill()
            dev.wait()
        dev.stdout.close()  # the pipe: left to the collector it warns (ResourceWarning)
        print("".join(lines))  # shown by pytest when the test fails



def test_dev_workers_share_the_port_and_the_store(tmp_path: Path) -> None:
    """`edgerun dev --workers 2`: the gateway as two processes on one port, sharing the store (the SQLite file's shared mode)."""
    port = free_port()
    env = user_env(tmp_path / "home")
    command = [sys.executable, "-m", "cli", "dev", "--port", str(port), "--admin-port", str(free_port()),
               "--workers", "2", "--no-embeddings"]
    dev = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 240
        assert dev.stdout is not None
        while not lines or not lines[-1].startswith("Ctrl-C stops"):
            line = dev.stdout.readline()
            assert line or dev.poll() is None, "edgerun dev exited:\n" + "".join(lines)
            assert time.monotonic() < deadline, "no banner within 240s:\n" + "".join(lines)
            lines.append(line)
        printed = "".join(lines)
        assert "(2 worker processes sharing the store)" in printed
        serve = [pid for pid, argv in command_lines(gateway_pids(dev.pid)).items() if b"serve" in argv]
        assert len(serve) == 1 and len(gateway_pids(serve[0])) == 2  # its two workers, sharing the file
        key = re.search(r"development key \(.*\): (\S+)", printed)
        assert key is not None
        url = f"http://127.0.0.1:{port}/client/v4/accounts/dev/ai/run/{DEFAULT_MODEL_ID}"
        workers = set()
        for _ in range(16):  # fresh connections: the kernel spreads them over the two workers
            answer = httpx.post(url, json={"prompt": "Hi", "max_tokens": 2},
                                headers={"authorization": f"Bearer {key.group(1)}"}, timeout=60)
            assert answer.status_code == 200, answer.text
            workers.add(answer.headers["x-edgerun-worker"])
        assert workers == {"0", "1"}

        dev.send_signal(signal.SIGTERM)
        assert dev.wait(timeout=90) == 0
        with pytest.raises(httpx.ConnectError):  # the workers are gone, the port free
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
        lines.append(dev.stdout.read())
        assert export(env, tmp_path / "bill.csv")["num_requests"] == 16  # both workers' records, each once
    finally:
        if dev.poll() is None:
            dev.kill()
            dev.wait()
        dev.stdout.close()
        print("".join(lines))
