"""`edgerun backend --engine trtllm`: write the worker's YAML and exec `trtllm-serve` in our place.

The process becomes trtllm-serve (same pid, so a supervisor's SIGTERM reaches it directly), which
then speaks the same backend protocol as our own server: /v1/completions, /v1/chat/completions,
/health, /v1/models, /metrics and POST /kv_cache_events.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from engines.tensorrt_llm.config import Role, TrtllmConfig, llm_api_options, to_yaml

INSTALL_HINT = """\
trtllm-serve is not on PATH, so `--engine trtllm` cannot start.
TensorRT-LLM needs Linux, an NVIDIA GPU and the CUDA toolkit. Install it from NVIDIA's index:
    sudo apt-get install -y libopenmpi-dev
    pip3 install --upgrade pip setuptools
    pip3 install tensorrt_llm --extra-index-url https://pypi.nvidia.com
or run inside NVIDIA's container (nvcr.io/nvidia/tensorrt-llm/release), where it is installed.
Without a GPU, use the built-in engine: edgerun backend --engine builtin ...
"""


class TrtllmServeMissing(RuntimeError):
    """trtllm-serve is not installed (or not on PATH); the message says how to install it."""


def serve_command(config: TrtllmConfig, *, host: str, port: int, options_path: Path) -> list[str]:
    """The trtllm-serve command line for one worker (documented flags only)."""
    return [
        "trtllm-serve",
        config.model_id,
        "--host",
        host,
        "--port",
        str(port),
        "--backend",
        "pytorch",
        "--extra_llm_api_options",
        str(options_path),
    ]


def write_options(config: TrtllmConfig, role: Role, directory: Path, name: str) -> Path:
    """Write the worker's `--extra_llm_api_options` YAML; returns its path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.yaml"
    path.write_text(to_yaml(llm_api_options(config, role), f"Written by edgerun for a {role} worker."))
    return path


def launch(
    config: TrtllmConfig,
    *,
    role: Role,
    host: str,
    port: int,
    work_dir: Path,
    which: Callable[[str], str | None] = shutil.which,
    execv: Callable[[str, list[str]], NoReturn] = os.execv,
) -> NoReturn:
    """Replace this process with trtllm-serve; raises TrtllmServeMissing when it is not installed."""
    executable = which("trtllm-serve")
    if executable is None:
        raise TrtllmServeMissing(INSTALL_HINT)
    options_path = write_options(config, role, work_dir, f"trtllm-{role}-{port}")
    command = serve_command(config, host=host, port=port, options_path=options_path)
    print(" ".join(command), file=sys.stderr, flush=True)
    execv(executable, command)
