"""What the gateway adds in front of a backend (the stub backend of tests/gateway/stub_backend.py).

    overhead.py       throughput and latency through the gateway vs the backend directly
    threads.py        a gateway's CPU per streamed request, thread by thread
    instructions.py   instructions per streamed request under callgrind (load-proof), against a baseline tree
    streams.py        thousands of open streams through one gateway process
    workers.py        `edgerun serve --workers N` for several N, in one run
    dashboard.py      what the usage dashboard's API costs against ledger size
    regions.py        two regions with an emulated WAN: latency in each, WAN traffic, propagation, shipping lag
    raw_load.py       the load generator: a lean raw HTTP/1.1 client, closed loop or Poisson
    sglang_router.py  the SGLang model gateway's Rust router, to compare with (not a dependency)
"""
