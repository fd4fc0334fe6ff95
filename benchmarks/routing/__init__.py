"""Routing policies: offline through the simulator (policies/sim), and on real engines.

    simulator.py      every evaluation trace x routing policy x gateway replica count
    kv_tiers.py       each trace x policy without KV tiers, with a host tier, and with a regional pool too
    kv_pool.py        KV tiers on real processes: two small-pool backends, host tiers + Mooncake pool, vs none
    vllm_backends.py  two real vLLM backends behind the gateway: cache-aware (their KV events) vs round-robin
    agent_runs.py     the agent-workload options and BenchConfig kv_pool.py and vllm_backends.py share
"""
