from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from engines.tensorrt_llm.config import TrtllmConfig
from engines.tensorrt_llm.launcher import TrtllmServeMissing, launch, serve_command

ROOT = Path(__file__).resolve().parents[2]


def test_missing_trtllm_serve_raises_with_install_hint(tmp_path: Path) -> None:
    with pytest.raises(TrtllmServeMissing, match="pypi.nvidia.com"):
        launch(TrtllmConfig(), role="mixed", host="127.0.0.1", port=8100, work_dir=tmp_path, which=lambda _: None)


def test_launch_writes_options_and_execs_trtllm_serve(tmp_path: Path) -> None:
    calls: list[tuple[str, list[str]]] = []

    class Exec(Exception):
        pass

    def fake_execv(path: str, argv: list[str]) -> None:
        calls.append((path, argv))
        raise Exec

    with pytest.raises(Exec):
        launch(
            TrtllmConfig(model="smollm2"),
            role="decode",
            host="0.0.0.0",
            port=8200,
            work_dir=tmp_path,
            which=lambda _: "/opt/bin/trtllm-serve",
            execv=fake_execv,  # type: ignore[arg-type]
        )
    [(path, argv)] = calls
    options_path = tmp_path / "trtllm-decode-8200.yaml"
    assert path == "/opt/bin/trtllm-serve"
    assert argv == serve_command(TrtllmConfig(model="smollm2"), host="0.0.0.0", port=8200, options_path=options_path)
    assert argv[:2] == ["trtllm-serve", "HuggingFaceTB/SmolLM2-135M-Instruct"]
    assert argv[argv.index("--backend") + 1] == "pytorch"
    options = yaml.safe_load(options_path.read_text())
    assert options["cache_transceiver_config"]["backend"] == "DEFAULT"


@pytest.mark.process
def test_cli_exits_non_zero_with_a_clear_message(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path), "HOME": str(tmp_path)}  # nothing on PATH
    result = subprocess.run(
        [sys.executable, "-m", "cli", "backend", "--engine", "trtllm", "--port", "8199"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode != 0
    assert "trtllm-serve is not on PATH" in result.stderr
    assert "pip3 install tensorrt_llm" in result.stderr
