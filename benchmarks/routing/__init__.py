"""Routing policies, measured offline through the simulator (policies/sim).

    simulator.py  every evaluation trace x routing policy x gateway replica count
    kv_tiers.py   each trace x policy without KV tiers, with a host tier, and with a regional pool too
"""
