"""The `edgerun` command line: one module per subcommand, each with `add_arguments(parser)` and
`run(args) -> int` (and optionally `logging_options(args)`).

    main.py      the dispatcher (`edgerun`, `python -m cli`): imports only the chosen subcommand
    logs.py      structured logging, configured once per process before the subcommand runs
    serve.py     `edgerun serve`: the gateway alone
    dev.py       `edgerun dev`: backend child processes and a gateway, with a development key
    dev_regions.py  `edgerun dev --regions N --wan-rtt-ms RTT`: N regions, a development key valid in all
    regions.py   several regions on this machine (Redis servers, WAN links, gateways), for dev and tests
    wan.py       an emulated WAN link between regions: a delaying, cuttable asyncio TCP proxy
    kv_pool.py   the region's KV pool master (mooncake_master) as a child, and the flags that join it
    backend.py   `edgerun backend`: one regional backend (built-in engine or TensorRT-LLM)
    chat.py      `edgerun chat`: the built-in engine in the terminal
    admin.py     `edgerun tenants` / `edgerun keys`: through the admin API or the store directly
    billing.py   `edgerun billing export|recompute|replay-spool`
    simulate.py  `edgerun simulate`: replay a trace through the routing policies
    draft.py     `edgerun draft train|eval`: an EAGLE-3 draft head for the built-in engine
    lora.py      `edgerun lora train`: a LoRA adapter (PEFT files) for the built-in engine's model
    processes.py child processes on loopback: start, wait until ready, stop (also for tests and tools)
    export_hf.py    `edgerun export-hf`: a built-in engine model written as a Hugging Face checkpoint
    workers.py      `edgerun serve --workers N`: N gateway processes on one port, kept by a supervisor
    parent_death.py children that end with the supervisor that started them

The commands are a face over the parts (gateway, backends, engines, policies): they parse flags,
build settings and call a service; nothing in those parts imports this package.
"""
