"""benchmarks/gateway/sglang_router.py without the router itself (`make test` never installs it): the command
line that starts it, and where its environment lives."""

from __future__ import annotations

from pathlib import Path

from benchmarks.gateway import sglang_router


def test_command_binds_loopback_in_front_of_the_workers() -> None:
    python = Path("/cache/venv/bin/python")
    argv = sglang_router.command(python, 4100, ["http://127.0.0.1:4200", "http://127.0.0.1:4201"], 4300)
    assert argv[:3] == [str(python), "-m", "sglang_router.launch_router"]
    options = " ".join(argv[3:])
    assert "--host 127.0.0.1 --port 4100" in options
    assert "--worker-urls http://127.0.0.1:4200 http://127.0.0.1:4201 --" in options
    assert "--policy round_robin" in options
    # metrics on loopback and a port of our own, not its default 0.0.0.0:29000
    assert "--prometheus-host 127.0.0.1 --prometheus-port 4300" in options


def test_each_version_gets_its_own_environment(tmp_path: Path) -> None:
    python = sglang_router.router_python(tmp_path)
    assert python == tmp_path / f"venv-{sglang_router.VERSION}" / "bin" / "python"
    assert not sglang_router.is_installed(python)
