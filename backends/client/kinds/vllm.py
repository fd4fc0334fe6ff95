"""vLLM's OpenAI-compatible server (`vllm serve` / `python -m vllm.entrypoints.openai.api_server`).

It takes `cache_salt` (into the first block's hash: tenants do not share cache entries),
`return_token_ids` and `stream_options.continuous_usage_stats`. It publishes KV events on a ZMQ
socket when started with `--kv-events-config '{"enable_kv_cache_events": true, "publisher":
"zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}'` (the backend's
`kv_events` / `kv_events_replay`), and reports cached prompt tokens only with
`--enable-prompt-tokens-details` (and then only on the final usage chunk of a stream). No `/load`.
Tenants' LoRA finetunes: started with `--enable-lora --max-lora-rank 32` and the environment's
`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`, it loads an adapter at `POST /v1/load_lora_adapter`
(`{lora_name, lora_path}`: a PEFT directory it reads, under the backend's `lora_dir`) and then
serves it as the model of that name (backends.client.adapters).
"""

from __future__ import annotations

from backends.client.kinds.base import BackendKind

VLLM = BackendKind(
    name="vllm",
    kv_events="zmq",
    returns_token_ids=True,
    cached_tokens_fix="start vLLM with --enable-prompt-tokens-details",
    loads_adapters=True,
)
