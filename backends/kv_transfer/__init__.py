"""Moving KV cache blocks between backends for disaggregated prefill/decode.

    layout.py   which bytes a block is, and the fingerprint both sides must share
    opaque.py   the context step's `encoded_opaque_state`: where and what to pull
    exports.py  the prefill side's pinned blocks, released on pull or after a TTL
    channel.py  the transport interface and the factory (tcp.py built in, mooncake.py)
    errors.py   what can go wrong, as one tree
    region_pool.py  the region's shared KV pool on Mooncake Store: keys, values, the client's calls
"""
