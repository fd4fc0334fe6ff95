"""Session fixtures around one real vLLM (tests/vllm/server.py), registered in tests/conftest.py.

- `vllm_server`: one vLLM server for the whole session (a start costs about a minute on 2 cores),
  its ZMQ KV-event publisher at `vllm_server.kv_events_endpoint` (replay at `.replay_endpoint`),
  its API key `VLLM_API_KEY`.
- `vllm_gateway`: an in-process gateway whose only backend is that server (id `VLLM_BACKEND_ID`,
  `kind = "vllm"`, subscribed to its KV events), serving `VLLM_MODEL_ID` with the tokenizer read
  from the exported checkpoint (`tokenizer_dir`).

More vLLM servers (two backends, one to restart): `tests.vllm.server.running_vllm`, each about a
minute to start on 2 idle cores; `VllmProcess.spec` is its `[[backends]]` entry.

Under CI=true a vLLM that is not installed or does not start fails every test that asks for it;
elsewhere those tests are skipped with the reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.fleet.catalog import DEFAULT_MODEL_ID
from tests.gateway.fixtures_e2e import InProcessGateway, gateway_settings
from tests.vllm.server import MAX_MODEL_LEN, SERVED_MODEL, VllmProcess, exported_smollm2, running_vllm

VLLM_API_KEY = "vllm-test-key-0123456789abcdef"
VLLM_BACKEND_ID = "vllm-a"
VLLM_MODEL_ID = DEFAULT_MODEL_ID


def vllm_model_spec(checkpoint: Path) -> dict[str, object]:
    """The catalog entry for SmolLM2 served by vLLM: the tokenizer from the checkpoint (vLLM does not
    serve ours) and the context the server was started with."""
    return {"id": VLLM_MODEL_ID, "backend_model": SERVED_MODEL, "tokenizer_dir": str(checkpoint), "context_length": MAX_MODEL_LEN}


@pytest.fixture(scope="session")
def vllm_checkpoint() -> Path:
    return exported_smollm2()


@pytest.fixture(scope="session")
def vllm_server(vllm_checkpoint: Path) -> Iterator[VllmProcess]:
    with running_vllm("vllm", vllm_checkpoint, VLLM_API_KEY) as server:
        yield server


@pytest.fixture(scope="session")
def vllm_gateway(
    vllm_server: VllmProcess, vllm_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[InProcessGateway]:
    settings = gateway_settings(
        tmp_path_factory.mktemp("vllm-gateway"),
        [vllm_server.spec(VLLM_BACKEND_ID, [VLLM_MODEL_ID])],
        models=[vllm_model_spec(vllm_checkpoint)],
        backend_api_key=VLLM_API_KEY,
        health_interval_s=0.5,
    )
    started = InProcessGateway(settings).start()
    yield started
    started.stop()
