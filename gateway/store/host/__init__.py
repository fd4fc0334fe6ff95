"""The store host: one process per machine keeping the store for all of its gateway workers.

`edgerun serve --workers N` without Redis starts `python -m gateway.store.host --socket PATH` and
gives the workers `EDGERUN_STORE_SOCKET=PATH`; each worker's `HostedStore` (client.py) sends every
store call to the host (server.py), which runs them on one `EmbeddedStore`, one at a time, as a
lone gateway does. No lock is shared between processes: the host's event loop orders the calls.

    protocol.py     frames (4-byte length + JSON), the callable methods, errors by name
    codec.py        the store's dataclasses as JSON and back
    server.py       the host: a Unix-socket server around one EmbeddedStore
    eager.py        runs a call on the spot, a task only if it waits
    holdings.py     each connection's request slots and in-flight tokens, freed when it closes
    socket_file.py  the socket file: private to its user, one live host per path
    file_claim.py   one host (or lone serve) per SQLite file
    connection.py   a worker's pipelined connection
    client.py       HostedStore, the worker's Store
    __main__.py     `python -m gateway.store.host --socket PATH`
    process.py      starts that as a child process and waits until it serves
"""
