"""`edgerun dev` (what `make run` starts): the printed curl command works as printed; Ctrl-C stops all."""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from cli.processes import ROOT, free_port

pytestmark = pytest.mark.slow


def test_make_run_prints_a_curl_that_works_and_ctrl_c_stops_both(tmp_path: Path) -> None:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "cli",
        "dev",
        "--port",
        str(port),
        "--sqlite-path",
        str(tmp_path / "dev.sqlite3"),
    ]
    dev = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 240
        curl = None
        assert dev.stdout is not None
        while curl is None:
            line = dev.stdout.readline()
            assert line or dev.poll() is None, "edgerun dev exited:\n" + "".join(lines)
            assert time.monotonic() < deadline, "no curl line within 240s:\n" + "".join(lines)
            lines.append(line)
            if line.strip().startswith("curl "):
                curl = line.strip()
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
        assert httpx.get(dashboard.group(1), timeout=5).headers["content-type"].startswith("text/html")
        usage = httpx.get(
            f"{dashboard.group(1)}/api/usage", headers={"authorization": f"Bearer {admin_token.group(1)}"}, timeout=10
        ).json()
        assert {t["tenant_id"]: t["requests"] for t in usage["tenants"]}.get("dev", 0) >= 1
        # the backend answers only its gateway: a random secret shared by the two for this run
        assert httpx.get(f"{backend_url.group(1)}/v1/models", timeout=5).status_code == 401
        assert httpx.get(f"{backend_url.group(1)}/health", timeout=5).status_code == 200

        dev.send_signal(signal.SIGINT)
        code = dev.wait(timeout=60)
        lines.append(dev.stdout.read())
        assert code == 0
        with pytest.raises(httpx.ConnectError):  # the backend child is gone too
            httpx.get(f"{backend_url.group(1)}/health", timeout=2)
    finally:
        if dev.poll() is None:
            dev.kill()
            dev.wait()
        print("".join(lines))  # shown by pytest when the test fails
