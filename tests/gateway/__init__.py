"""The gateway's tests, in folders that mirror its layers (gateway/http, pipeline, fleet, billing, store).

The rule: a test module sits in the folder of the layer whose module it tests (tests/gateway/http/
test_body.py tests gateway/http/body.py), even when a few of its tests start a process (a Redis
variant, a served listener). A module every test of which drives the whole gateway through real
processes (a gateway over HTTP in front of a stub backend, `edgerun serve`, Redis stalled or full)
shows no one layer and goes to e2e/, named for the behaviour it shows. billing/, store/ and
regional/ were grouped by layer before and keep their own end-to-end modules (`test_e2e_*`,
regional/test_regions.py).

- http/: the ASGI app, listeners, batch upkeep, bodies, envelopes, SSE, OpenAPI, admin guard, parsers' properties;
  http/dashboard/: the dashboard's API, page, summary and browser tests.
- pipeline/: auth, admission holds, the batch queue, request fields and schemas, routing, tokenization, tools,
  generation, answer cache, offload, setup gate, tenant salt.
- fleet/: the catalog, engine and KV indexes, the KV tiers, the monitor, outlier ejection.
- billing/: metering, prices, exports, the spool, recompute, the billing API.
- store/: the store's contracts, once per implementation (store/local/, store/redis/).
- regional/: two regions as real processes.
- e2e/: the whole gateway as real processes: faults, overload, shutdown, `serve --workers`, the store
  paused or full, client SDKs, fuzzing, the end-to-end checks of each feature (`*_e2e.py`).
- here: the top-level gateway/settings.py (test_settings.py), and the helpers every folder shares:
  conftest.py, fixtures_context.py, fixtures_e2e.py, fixtures_store.py, fixtures_tokenizer.py (fixtures,
  registered in tests/conftest.py), stub_backend.py, fault_proxy.py, redis_server.py, vllm_stub.py,
  finetune_tenants.py (tenants speaking the finetunes API, for the built-in and the vLLM finetune tests),
  with the tests of the stub and the proxy themselves (test_stub_backend.py, test_fault_proxy.py).
"""
