"""The built-in KV transport: one TCP connection per pull, block bytes straight from cache to cache.

    exporter -> puller   nonce (32 bytes)
    puller -> exporter   u32 length, request JSON {op, pin_id, first_block, fingerprint},
                         HMAC-SHA256(secret, nonce + request JSON) (32 bytes)
    exporter -> puller   u32 length, answer JSON {ok, nbytes} or {ok: false, kind, error}
                         then `nbytes` bytes of blocks (op "pull"; layout.py's order)
    puller -> exporter   one ack byte once everything arrived: the exporter releases the pin

`op: "lease"` sends no bytes: it holds the pin while another transport (mooncake.py) reads the
memory, and the ack releases it. The secret is the backend API key the gateway and every backend
share (backends/server/auth.py), so only a holder of it can read KV; the nonce makes a recorded
request useless. Sends and receives are `sock_sendall` / `sock_recv_into` on memoryviews of the
cache: no intermediate buffer, and the engine thread keeps stepping meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import secrets
import socket
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from backends.kv_transfer.errors import (
    FingerprintMismatch,
    KVTransferError,
    PinNotFound,
    TransferFailed,
    TransferRefused,
)
from backends.kv_transfer.exports import KVExports
from backends.kv_transfer.layout import KVLayout

log = logging.getLogger("edgerun.kv_transfer")

NONCE_BYTES = 32
MAX_HEADER_BYTES = 64 * 1024
ACK = b"\x01"
CONNECT_TIMEOUT_S = 5.0
IO_TIMEOUT_S = 30.0  # any one read or write of a transfer
_KINDS = {"pin": PinNotFound, "fingerprint": FingerprintMismatch, "refused": TransferRefused}


@dataclass(slots=True, frozen=True)
class PullRequest:
    op: str  # "pull" or "lease"
    pin_id: int
    first_block: int
    fingerprint: str


class TcpExporter:
    """Serves pulls of pinned blocks (prefill and mixed backends)."""

    def __init__(self, layout: KVLayout, exports: KVExports, secret: bytes, host: str, port: int = 0) -> None:
        self.layout = layout
        self.exports = exports
        self._secret = secret
        self._host = host
        self._port = port
        self._sock: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self.num_bytes_sent = 0

    @property
    def port(self) -> int:
        assert self._sock is not None, "start() first"
        port: int = self._sock.getsockname()[1]
        return port

    async def start(self) -> None:
        sock = socket.create_server((self._host, self._port), reuse_port=False)
        sock.setblocking(False)
        self._sock = sock
        self._accepting = asyncio.create_task(self._accept_loop(), name="edgerun-kv-accept")

    async def stop(self) -> None:
        tasks = [t for t in (self._accepting, *self._handlers) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._sock is not None:
            self._sock.close()

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._sock is not None
        while True:
            conn, _ = await loop.sock_accept(self._sock)
            conn.setblocking(False)
            task = asyncio.create_task(self._serve(conn))
            self._handlers.add(task)
            task.add_done_callback(self._handlers.discard)

    async def _serve(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        with conn:
            try:
                nonce = secrets.token_bytes(NONCE_BYTES)
                await loop.sock_sendall(conn, nonce)
                raw, mac = await asyncio.wait_for(_read_request(loop, conn), IO_TIMEOUT_S)
                if not hmac.compare_digest(mac, _mac(self._secret, nonce, raw)):
                    await _send_json(loop, conn, {"ok": False, "kind": "refused", "error": _AUTH_HELP})
                    return
                request = _parse_request(raw)
                await self._answer(loop, conn, request)
            except (OSError, TimeoutError, ConnectionError, asyncio.IncompleteReadError, ValueError) as exc:
                log.warning("KV transfer connection failed: %s", exc)

    async def _answer(self, loop: asyncio.AbstractEventLoop, conn: socket.socket, request: PullRequest) -> None:
        if request.fingerprint != self.layout.fingerprint:
            error = "the two backends' KV caches differ (model, block size, dtype or layout): pair matching backends"
            await _send_json(loop, conn, {"ok": False, "kind": "fingerprint", "error": error})
            return
        try:
            pin = self.exports.lease(request.pin_id)
        except PinNotFound as exc:
            await _send_json(loop, conn, {"ok": False, "kind": "pin", "error": exc.message})
            return
        pulled = False
        try:
            blocks = pin.block_ids[request.first_block :] if request.op == "pull" else []
            if request.first_block > len(pin.block_ids):
                raise ValueError(f"first_block {request.first_block} is past the pin's {len(pin.block_ids)} blocks")
            await _send_json(loop, conn, {"ok": True, "nbytes": self.layout.nbytes(len(blocks))})
            for segment in self.layout.segments(blocks):
                await asyncio.wait_for(loop.sock_sendall(conn, segment), IO_TIMEOUT_S)
                self.num_bytes_sent += len(segment)
            ack = await asyncio.wait_for(loop.sock_recv(conn, 1), IO_TIMEOUT_S)
            pulled = ack == ACK
        finally:
            await self.exports.finish(request.pin_id, pulled=pulled)


async def tcp_pull(
    layout: KVLayout, secret: bytes, host: str, port: int, request: PullRequest, dst_blocks: list[int]
) -> int:
    """Pull (or lease, with `dst_blocks` empty) blocks of a pin into our own `dst_blocks`.

    For a lease the connection stays open until `send_ack`: use `tcp_lease` instead.
    Returns the bytes received; raises a KVTransferError.
    """
    loop = asyncio.get_running_loop()
    conn = await _connect(loop, host, port)
    with conn:
        expected = await _handshake(loop, conn, secret, request)
        if expected != layout.nbytes(len(dst_blocks)):
            raise TransferRefused(f"the exporter offers {expected} bytes but {len(dst_blocks)} blocks need "
                                  f"{layout.nbytes(len(dst_blocks))}: the pin covers a different prompt")
        received = 0
        try:
            for segment in layout.segments(dst_blocks):
                received += await asyncio.wait_for(_recv_into(loop, conn, segment), IO_TIMEOUT_S)
            await loop.sock_sendall(conn, ACK)
        except (OSError, TimeoutError, ConnectionError) as exc:
            raise TransferFailed(f"the KV transfer from {host}:{port} broke after {received} bytes: {exc}") from exc
        return received


@contextlib.asynccontextmanager
async def tcp_lease(secret: bytes, host: str, port: int, request: PullRequest) -> AsyncIterator[None]:
    """Hold the pin while the body runs; acknowledge (release it) only if the body succeeded."""
    loop = asyncio.get_running_loop()
    conn = await _connect(loop, host, port)
    with conn:
        await _handshake(loop, conn, secret, request)
        yield
        with contextlib.suppress(OSError):
            await loop.sock_sendall(conn, ACK)


async def _connect(loop: asyncio.AbstractEventLoop, host: str, port: int) -> socket.socket:
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family, type_, proto, _, address = infos[0]
        conn = socket.socket(family, type_, proto)
        conn.setblocking(False)
        try:
            await asyncio.wait_for(loop.sock_connect(conn, address), CONNECT_TIMEOUT_S)
        except BaseException:
            conn.close()
            raise
    except (OSError, TimeoutError) as exc:
        raise TransferFailed(f"cannot reach the KV exporter at {host}:{port}: {exc}") from exc
    return conn


async def _handshake(loop: asyncio.AbstractEventLoop, conn: socket.socket, secret: bytes, request: PullRequest) -> int:
    raw = json.dumps(
        {"op": request.op, "pin_id": request.pin_id, "first_block": request.first_block, "fingerprint": request.fingerprint},
        separators=(",", ":"),
    ).encode()
    try:
        nonce = await asyncio.wait_for(_recv_exactly(loop, conn, NONCE_BYTES), IO_TIMEOUT_S)
        await loop.sock_sendall(conn, struct.pack("!I", len(raw)) + raw + _mac(secret, nonce, raw))
        answer = await asyncio.wait_for(_read_json(loop, conn), IO_TIMEOUT_S)
    except (OSError, TimeoutError, ConnectionError, ValueError) as exc:
        raise TransferFailed(f"the KV exporter's handshake failed: {exc}") from exc
    if not answer.get("ok"):
        error_type = _KINDS.get(str(answer.get("kind")), KVTransferError)
        raise error_type(str(answer.get("error") or "the KV exporter refused the pull"))
    return int(answer.get("nbytes", 0))


_AUTH_HELP = "the pull is not signed with this backend's API key: give both backends the same EDGERUN_API_KEY"


def _mac(secret: bytes, nonce: bytes, raw: bytes) -> bytes:
    return hmac.new(secret, nonce + raw, hashlib.sha256).digest()


def _parse_request(raw: bytes) -> PullRequest:
    data: Any = json.loads(raw)
    request = PullRequest(str(data["op"]), int(data["pin_id"]), int(data["first_block"]), str(data["fingerprint"]))
    if request.op not in ("pull", "lease") or request.first_block < 0:
        raise ValueError(f"bad KV request {data!r}")
    return request


async def _read_request(loop: asyncio.AbstractEventLoop, conn: socket.socket) -> tuple[bytes, bytes]:
    (length,) = struct.unpack("!I", await _recv_exactly(loop, conn, 4))
    if length > MAX_HEADER_BYTES:
        raise ValueError(f"KV request header of {length} bytes is too large")
    raw = await _recv_exactly(loop, conn, length)
    return raw, await _recv_exactly(loop, conn, 32)


async def _send_json(loop: asyncio.AbstractEventLoop, conn: socket.socket, payload: dict[str, Any]) -> None:
    raw = json.dumps(payload, separators=(",", ":")).encode()
    await loop.sock_sendall(conn, struct.pack("!I", len(raw)) + raw)


async def _read_json(loop: asyncio.AbstractEventLoop, conn: socket.socket) -> dict[str, Any]:
    (length,) = struct.unpack("!I", await _recv_exactly(loop, conn, 4))
    if length > MAX_HEADER_BYTES:
        raise ValueError(f"KV answer header of {length} bytes is too large")
    answer = json.loads(await _recv_exactly(loop, conn, length))
    if not isinstance(answer, dict):
        raise ValueError("the KV answer is not a JSON object")
    return answer


async def _recv_exactly(loop: asyncio.AbstractEventLoop, conn: socket.socket, n: int) -> bytes:
    buffer = bytearray(n)
    await _recv_into(loop, conn, memoryview(buffer))
    return bytes(buffer)


async def _recv_into(loop: asyncio.AbstractEventLoop, conn: socket.socket, view: memoryview) -> int:
    filled = 0
    while filled < len(view):
        n = await loop.sock_recv_into(conn, view[filled:])
        if n == 0:
            raise ConnectionError(f"the peer closed the connection after {filled} of {len(view)} bytes")
        filled += n
    return filled
