"""The serving benchmark: replay workloads against a gateway at fixed load, compare routing policies.

mooncake.py (the trace, scaled down), workload.py (sessions to replay), client.py (one timed
request), runner.py (rate, concurrency or trace-clock load), metrics.py (percentiles,
throughput, goodput, cached ratio), report.py and plots.py (markdown, JSON, PNG), suite.py
(policies x workloads x load levels on fresh processes) and cli.py (`python -m loadtests.bench`).
"""
