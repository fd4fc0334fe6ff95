"""The SGLang model gateway (its Rust router) in front of a worker, to compare with: not a project dependency.

    python -m benchmarks.gateway.sglang_router        # installs it on first use, prints its version and interpreter

`install` puts `sglang-router==0.3.2` from PyPI (an abi3 wheel: the Rust router as a Python extension,
started from Python) into its own virtual environment under ~/.cache/edgerun/sglang-router, so neither
it nor what it pulls in (fastapi, aiohttp, orjson, ...) touches the project's environment. `start` runs
`python -m sglang_router.launch_router` on loopback in front of the given workers: regular mode (not
prefill/decode), a round-robin policy, Prometheus metrics on a free loopback port (its default is
0.0.0.0:29000, which two runs at once would share), warnings only in its log. The router and its Tokio
threads are one process, so that process's CPU time is the router's.

What it asks of a worker: GET /health when it registers it (then every 60 s), and its model's name
from /server_info, /get_server_info, /model_info or /get_model_info, which may all be 404 (the model
is then "unknown" and requests for any model go to it). Chat requests go through as they come, to the
worker's /v1/chat/completions. It is ready when /readiness counts a healthy worker.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from cli.processes import ChildProcess, free_port

VERSION = "0.3.2"
HOME = Path.home() / ".cache" / "edgerun" / "sglang-router"


def router_python(home: Path = HOME) -> Path:
    """The interpreter of the router's own environment (one per version)."""
    return home / f"venv-{VERSION}" / "bin" / "python"


def is_installed(python: Path) -> bool:
    if not python.exists():
        return False
    check = [str(python), "-c", "import importlib.metadata as m; print(m.version('sglang-router'))"]
    found = subprocess.run(check, capture_output=True, text=True, check=False)
    return found.returncode == 0 and found.stdout.strip() == VERSION


def install(home: Path = HOME) -> Path:
    """The router's interpreter, creating its environment and installing the router the first time."""
    python = router_python(home)
    if not is_installed(python):
        print(f"installing sglang-router=={VERSION} into {python.parents[1]} (once)", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(python.parents[1])], check=True)
        pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        subprocess.run([*pip, f"sglang-router=={VERSION}"], check=True)
    return python


def command(python: Path, port: int, worker_urls: Sequence[str], metrics_port: int) -> list[str]:
    """The argv of a router on 127.0.0.1:`port` in front of `worker_urls`."""
    return [
        str(python),
        "-m",
        "sglang_router.launch_router",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--worker-urls",
        *worker_urls,
        "--policy",
        "round_robin",
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(metrics_port),
        "--log-level",
        "warn",
    ]


def start(worker_urls: Sequence[str], home: Path = HOME) -> ChildProcess:
    """A router in front of `worker_urls`, ready (its workers registered and healthy)."""
    port = free_port()
    router = ChildProcess.launch("sglang-router", command(install(home), port, worker_urls, free_port()), port)
    try:
        router.wait_ready("/readiness")
    except BaseException:
        router.stop(timeout_s=5)
        raise
    return router


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gateway.sglang_router", description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, default=HOME, help="where its environment lives")
    args = parser.parse_args(argv)
    python = install(args.home)
    version = subprocess.run([str(python), "-m", "sglang_router", "--version"], capture_output=True, text=True)
    print(f"{version.stdout.strip() or VERSION}\n{python}")
    return version.returncode


if __name__ == "__main__":
    sys.exit(main())
