"""The KV transport interface and its two implementations' pulling side.

A `KVChannel` pulls blocks of a pin (named by an `OpaqueState`) into local blocks. Every
backend that runs context steps also runs a `TcpExporter` (tcp.py): it is the control point of
every pin (lease, release, TTL) and the data path of the built-in transport. The Mooncake
Transfer Engine channel reads the exporter's registered cache memory itself, under a TCP lease.

    TcpChannel       bytes over the exporter's TCP connection (the default; no extra dependency)
    MooncakeChannel  Mooncake Transfer Engine (`mooncake-transfer-engine-non-cuda`, protocol tcp,
                     metadata P2PHANDSHAKE), the cache's memory registered once per process
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from backends.kv_transfer.errors import TransferFailed
from backends.kv_transfer.layout import KVLayout
from backends.kv_transfer.opaque import OpaqueState
from backends.kv_transfer.tcp import PullRequest, tcp_lease, tcp_pull


class KVChannel(Protocol):
    name: str

    def opaque_extra(self, block_ids: list[int]) -> dict[str, Any]:
        """What this transport adds to the opaque state of a pin of `block_ids`."""
        ...

    async def pull(self, source: OpaqueState, first_block: int, dst_blocks: list[int]) -> int:
        """Fill `dst_blocks` with the source pin's blocks from `first_block` on; returns bytes moved."""
        ...

    def close(self) -> None: ...


class TcpChannel:
    name = "tcp"

    def __init__(self, layout: KVLayout, secret: bytes) -> None:
        self.layout = layout
        self._secret = secret

    def opaque_extra(self, block_ids: list[int]) -> dict[str, Any]:
        return {}

    async def pull(self, source: OpaqueState, first_block: int, dst_blocks: list[int]) -> int:
        request = PullRequest("pull", source.pin_id, first_block, self.layout.fingerprint)
        return await tcp_pull(self.layout, self._secret, source.host, source.port, request, dst_blocks)

    def close(self) -> None:
        pass


class MooncakeChannel:
    name = "mooncake"

    def __init__(self, layout: KVLayout, secret: bytes, host: str) -> None:
        from mooncake.engine import TransferEngine  # optional dependency: imported only when chosen

        self.layout = layout
        self._secret = secret
        self._engine = TransferEngine()
        if self._engine.initialize(host, "P2PHANDSHAKE", "tcp", "") != 0:
            raise RuntimeError(f"the Mooncake transfer engine failed to start on {host}")
        self.session = f"{host}:{self._engine.get_rpc_port()}"
        nbytes = layout.caches[0].numel() * layout.caches[0].element_size()
        for cache in layout.caches:  # once: every transfer reads or writes inside these
            if self._engine.register_memory(cache.data_ptr(), nbytes) != 0:
                raise RuntimeError("the Mooncake transfer engine could not register the KV cache memory")

    def opaque_extra(self, block_ids: list[int]) -> dict[str, Any]:
        return {"session": self.session, "layers": [c.data_ptr() for c in self.layout.caches], "block_ids": block_ids}

    async def pull(self, source: OpaqueState, first_block: int, dst_blocks: list[int]) -> int:
        extra = source.extra
        try:
            session, remote_layers, src_blocks = str(extra["session"]), list(extra["layers"]), list(extra["block_ids"])
        except (KeyError, TypeError) as exc:
            raise TransferFailed("the opaque state has no Mooncake session: the exporter runs another transport") from exc
        src_blocks = src_blocks[first_block:]
        if len(src_blocks) != len(dst_blocks) or len(remote_layers) != len(self.layout.caches):
            raise TransferFailed("the pin's blocks or layers do not match this request")
        local, remote, lengths = self._plan(remote_layers, src_blocks, dst_blocks)
        request = PullRequest("lease", source.pin_id, first_block, self.layout.fingerprint)
        async with tcp_lease(self._secret, source.host, source.port, request):
            if local:
                status = await asyncio.to_thread(self._engine.batch_transfer_sync_read, session, local, remote, lengths)
                if status != 0:
                    raise TransferFailed(f"the Mooncake read from {session} failed (status {status})")
        return sum(lengths)

    def _plan(
        self, remote_layers: list[int], src_blocks: list[int], dst_blocks: list[int]
    ) -> tuple[list[int], list[int], list[int]]:
        """(local address, remote address, length) per run of blocks consecutive on both sides."""
        size = self.layout.block_nbytes
        local: list[int] = []
        remote: list[int] = []
        lengths: list[int] = []
        for cache, remote_base in zip(self.layout.caches, remote_layers, strict=True):
            local_base = cache.data_ptr()
            for i, (src, dst) in enumerate(zip(src_blocks, dst_blocks, strict=True)):
                contiguous = i > 0 and src == src_blocks[i - 1] + 1 and dst == dst_blocks[i - 1] + 1
                if contiguous:
                    lengths[-1] += size
                else:
                    local.append(local_base + dst * size)
                    remote.append(int(remote_base) + src * size)
                    lengths.append(size)
        return local, remote, lengths

    def close(self) -> None:
        pass


def build_channel(transport: str, layout: KVLayout, secret: bytes, host: str) -> KVChannel:
    if transport == "mooncake":
        return MooncakeChannel(layout, secret, host)
    return TcpChannel(layout, secret)
