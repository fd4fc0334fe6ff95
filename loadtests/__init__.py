"""Load tests and the serving benchmark for an edgerun gateway.

Locust scenarios (locustfile.py, locust_users.py, locust_metrics.py), the benchmark harness
(bench/), and what both share: the stack launcher (stack.py, over processes.py, which the
end-to-end test fixtures use too), tenant provisioning (tenants.py), simulated conversations
(conversations.py, words.py) and the Workers AI stream reader (workers_ai.py). See loadtests/README.md for the commands.
"""
