"""Benchmarks: one script per measurement in BENCHMARKS.md, run as `python -m benchmarks.<subject>.<name>`.

    common.py      what every benchmark shares: the machine line, CPU time of a process, interleaved rounds
    engine/        the built-in engine in-process: against transformers and llama.cpp, the runner, weight
                   formats, the fast mode's tolerance, decode groups, step split, guided decoding, CUDA
    backend/       `edgerun backend` over HTTP: the server's cost, the serving path, llama.cpp's server,
                   weight formats served, cold start, embeddings
    gateway/       what the gateway adds: overhead, its threads, open streams, workers, the dashboard,
                   the load generator and the SGLang router to compare with
    routing/       routing policies: over the evaluation traces in the simulator, and on real vLLM backends
    disagg/        disaggregated prefill/decode, and what importing KV costs a decode backend's streams
    speculative/   speculative decoding on vs off, draft policies replayed, verify cost, EAGLE-3 data
    store/         ledger writes and keys, the store calls of one streamed request
    attack/        the listener attacks against a gateway

Outside the product packages, so that nothing the gateway, backends or engines ship exists only to be
measured. The stub backend the gateway benchmarks stand behind is the tests' (tests/gateway/stub_backend.py):
benchmarks may import tests, tests never import benchmarks (except tests/benchmarks, which test them).
"""
