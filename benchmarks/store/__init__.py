"""The gateway's store: ledger writes and the store calls a request makes.

    ledger.py         ledger write throughput per store, and metering's cost per request
    ledger_keys.py    random (UUID v4) against time-ordered (v7) ledger keys
    request_calls.py  the store calls of one streamed request, on each store
"""
