"""A real vLLM server for the tests: started by tests/vllm/process.py (its command line and why),
from `.venv-vllm` or `EDGERUN_TEST_VLLM_PYTHON`, serving the shipped SmolLM2 exported once as a
Hugging Face checkpoint (`edgerun export-hf`, engines/builtin/loader/export.py). A vLLM that is
missing or does not start skips the test, or fails it under CI=true.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.processes import ProcessError
from engines.builtin.config import EngineConfig
from engines.builtin.loader.export import export_hf
from tests.vllm.process import BLOCK_SIZE, MAX_MODEL_LEN, SERVED_MODEL, VENV_PYTHON, VllmProcess, start_vllm

VLLM_PYTHON_ENV = "EDGERUN_TEST_VLLM_PYTHON"  # another vLLM install's python, instead of .venv-vllm's
__all__ = ["BLOCK_SIZE", "MAX_MODEL_LEN", "SERVED_MODEL", "VllmProcess", "exported_smollm2", "running_vllm"]
READY_TIMEOUT_S = 420.0  # about 1 minute on 2 idle cores; more while other tests run beside it


def vllm_python() -> Path:
    """The python of the vLLM install. Missing: the test is skipped, or fails under CI=true."""
    python = Path(os.environ.get(VLLM_PYTHON_ENV) or VENV_PYTHON)
    if not python.exists():
        cannot_start(f"no vLLM at {python}: `make test` installs it (or set {VLLM_PYTHON_ENV})")
    return python


def cannot_start(reason: str) -> None:
    """Skip the test that needs vLLM, except under CI=true, where a vLLM that cannot start is a failure."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: the real-vLLM tests must run)", pytrace=False)
    pytest.skip(reason)


def exported_smollm2() -> Path:
    """The shipped SmolLM2 as a Hugging Face checkpoint, exported on first use (`make` does it at install)."""
    return export_hf(EngineConfig(model="smollm2"))


@contextlib.contextmanager
def running_vllm(name: str, checkpoint: Path, api_key: str, *, dev_mode: bool = False) -> Iterator[VllmProcess]:
    """A ready vLLM server, stopped at the end; one that does not come up is skipped or failed (`cannot_start`)."""
    server = start_vllm(vllm_python(), name, checkpoint, api_key, dev_mode=dev_mode)
    try:
        try:
            server.wait_ready("/health", READY_TIMEOUT_S)
        except ProcessError as exc:
            cannot_start(f"vLLM did not start: {exc}")
        yield server
    finally:
        server.stop()
