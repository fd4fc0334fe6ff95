"""Attacks on edgerun, before and after their defences: a gateway's listeners, an embedding backend's queue.

    listeners.py           the listener attacks of issue 18, before and after, in one run
    embedding_fairness.py  one tenant's big embedding batches against another's small requests (issue 36)
"""
