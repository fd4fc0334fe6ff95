"""The request pipeline: from a parsed request to a settled generation or embedding.

No module here imports Starlette; they import downwards only (fleet, billing, store).

    generation.py       one generation: auth, limits, routing, the backend stream, settled once
    embedding.py        one embedding request, the same steps without a stream
    answer_cache.py     the opt-in exact response cache (AI Gateway's cf-aig-cache-* headers) in front of generation
    replay.py           a cached answer played back as a generation is read (one renderer for both)
    batch.py            the asynchronous batch API's bodies (items checked as their own requests) and answers
    holds.py            what a request holds (its ticket, a disaggregated step's route), released once by one settle
    ticket.py           a request's admission (slot, tpm, budget, in-flight tokens) in one store call, and its settle
    auth.py             API key -> tenant, account and model checks, requests per minute
    concurrency.py      per-tenant requests in flight: the limit, and the refusal
    tokenization.py     chat template + tokenizer per model, fetched once and cached
    chat_template.py    a model's Jinja chat template, rendered in a sandbox
    offload.py          CPU-heavy request work (large bodies, templates, tokenizing) off the event loop
    routing.py          prompt tokens -> backends to try, and the in-flight bookkeeping
    disagg.py           the two-step prefill -> decode flow across the prefill and decode pools
    tenant_salt.py      the per-tenant cache salt
    schemas.py          request bodies -> plain data, with the field named when one is wrong
    request_fields.py   which fields each API accepts, ignores or refuses
    embedding_input.py  embedding request bodies -> plain data
    model_schema.py     the input/output JSON schemas that model search returns
    setup_gate.py       a bound on how many requests do their CPU-bound setup at once
    structured.py       JSON mode: a client's `response_format` in the form every backend takes
    tools.py            function calling: tools into the prompt and a grammar, the answer into tool calls
    finetunes.py        tenants' LoRA finetunes: upload checks, the adapter directory, a request's `lora`
    adapter_unload.py   a deleted finetune's adapter, unloaded from every backend of its base model
    settings.py         the `[routing]`, `[limits]`, `[disagg]` and `[batch]` sections
"""
