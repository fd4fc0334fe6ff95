"""A real vLLM server on loopback, as the tests (tests/vllm) and benchmarks/routing/vllm_backends.py start it:
vLLM's CPU build (the Makefile installs it in `.venv-vllm`, a venv of its own) serving the shipped
SmolLM2, exported once as a Hugging Face checkpoint (`edgerun export-hf`).

It is started as README's "Backends" section says, plus what a small CPU box needs: `--enforce-eager`
(no torch.compile warm-up: about half the start time on 2 cores), a 4,096-token context and 1 GiB
of KV cache (`VLLM_CPU_KVCACHE_SPACE`), one OpenMP thread without core binding (vLLM binds every
server to core 0 by default, which would stack two of them on one core), and no usage reports.
Tenants' finetunes are served as README says: `--enable-lora --max-lora-rank 32` and runtime loading
(`VLLM_ALLOW_RUNTIME_LORA_UPDATING`), the gateway loading each adapter from the finetunes directory.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from cli.processes import ROOT, ChildProcess, free_port

VENV_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
SERVED_MODEL = "smollm2"  # `--served-model-name`: the gateway's `backend_model`
MAX_MODEL_LEN = 4096
BLOCK_SIZE = 32  # KV block: vLLM's CPU attention takes multiples of 32; its default there, 128, would leave short prompts uncached


@dataclass
class VllmProcess(ChildProcess):
    """`python -m vllm.entrypoints.openai.api_server ...`; `kv_events_endpoint` is its ZMQ publisher
    (which it binds), `replay_endpoint` its replay socket."""

    api_key: str = ""
    kv_events_endpoint: str = ""
    replay_endpoint: str = ""

    def spec(self, backend_id: str, models: Sequence[str], region: str = "local") -> dict[str, object]:
        """A gateway `[[backends]]` entry for this server, its KV events included."""
        return {
            "id": backend_id, "base_url": self.url, "region": region, "models": list(models), "kind": "vllm",
            "kv_events": self.kv_events_endpoint, "kv_events_replay": self.replay_endpoint,
        }  # fmt: skip

    def metric(self, name: str) -> float:
        """A `vllm:*` Prometheus sample of its `/metrics`, summed over its labels."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        samples = (line.rpartition(" ") for line in text.splitlines())
        return sum(float(value) for series, _, value in samples if series.split("{", 1)[0] == name)


def vllm_command(python: Path, checkpoint: Path, port: int, api_key: str, kv_events: str, replay: str) -> list[str]:
    """The README's command line (see its "Backends" section), sized for a small CPU box."""
    events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": kv_events, "replay_endpoint": replay}
    return [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(checkpoint), "--served-model-name", SERVED_MODEL,
        "--host", "127.0.0.1", "--port", str(port),
        "--api-key", api_key,
        "--dtype", "float32",
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--kv-events-config", json.dumps(events),
        "--block-size", str(BLOCK_SIZE),
        "--max-model-len", str(MAX_MODEL_LEN),
        "--enforce-eager",
        "--enable-lora", "--max-lora-rank", "32",  # tenants' finetunes, loaded at runtime (tests/vllm/test_vllm_lora.py)
        "--enable-log-requests",  # its log names each request (by the gateway's x-request-id) and each abort
        "--disable-uvicorn-access-log",
    ]  # fmt: skip


def start_vllm(
    python: Path, name: str, checkpoint: Path, api_key: str, *, dev_mode: bool = False, log_path: Path | None = None
) -> VllmProcess:
    """Spawn a vLLM server with `python`, its install's (not yet ready: call `wait_ready`). `dev_mode`:
    its development routes too (`VLLM_SERVER_DEV_MODE`), among them `POST /reset_prefix_cache`,
    which empties its prefix cache and publishes `AllBlocksCleared`."""
    port = free_port()
    # vLLM binds its publisher on an ipc:// endpoint (on a tcp:// one naming a host it would connect
    # out instead): any number of gateways may subscribe, and nothing listens beyond this machine.
    # Its replay socket binds either way.
    kv_events = f"ipc://{tempfile.gettempdir()}/edgerun-vllm-{port}-kv-events"
    replay = f"tcp://127.0.0.1:{free_port()}"
    env = {
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB: about 23,000 tokens of SmolLM2 in float32
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",  # everything is local; nothing may be fetched
        "VLLM_SERVER_DEV_MODE": "1" if dev_mode else "0",
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",  # POST /v1/load_lora_adapter: the gateway loads finetunes
    }
    argv = vllm_command(python, checkpoint, port, api_key, kv_events, replay)
    return VllmProcess.launch(
        name, argv, port, env=env, threads=1, own_group=True, log_path=log_path,  # `kill` takes its engine processes too
        api_key=api_key, kv_events_endpoint=kv_events, replay_endpoint=replay,
    )
