"""What the parts agree on: wire shapes and encodings shared by the gateway, backends and engines.

A top-level package because both sides of an HTTP boundary (and `policies`) need the same
definition, and none of them may import the others. Pure: it imports nothing of ours (only
Starlette for the one shared streaming response, pydantic-settings for the settings base).

    prefix_hash.py  the one tenant-salted chain of KV block hashes
    usage.py        the one `Usage` (token counts), from a backend's chunk to the ledger record
    sse.py          server-sent event framing and the one closing event-stream response
    streaming.py    the streaming response under it: ready events written together, one disconnect watcher
    openai_error.py OpenAI's error body
    request_id.py   the request id header that follows a request into the backend's engine
    kv_events.py    the KV cache event JSON (TensorRT-LLM's shape) backends send and the gateway reads
    tokenizer.py    the tokenizer payload a backend serves and the gateway caches
    schema_integers.py  the integers a guided-decoding JSON Schema may hold (signed 64-bit)
    chat_tokens.py  chat prompts as token ids where only the template's special tokens are control tokens
    settings.py     `TomlSettings`, the base of every part's settings (env vars + TOML)
    reject_if_busy.py  the header by which the gateway asks a backend to refuse what it cannot start at once
    lora_adapter.py    a LoRA adapter's PEFT files and what may be served (checked on upload and on load)
"""
