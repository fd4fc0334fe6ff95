"""The one seam through which the gateway reaches any backend (ours, trtllm-serve, vLLM, SGLang).

All upstream I/O goes through one `HTTPTransport` (`backends.client.http`: a keep-alive
connection pool), and every transport error is converted here into the tree in
`backends.client.errors`.

Streams are async generators. A consumer that stops early should close the stream
(`async with contextlib.aclosing(stream)` or `await stream.aclose()`); cancelling the consuming
task closes it too. Closing drops the HTTP connection at once, so the backend sees the disconnect
and aborts the generation. A stream read to its `[DONE]` reads the rest of the body too (briefly:
see `_drain`), so its keep-alive connection goes back to the pool for the next request. "First
byte" means the first SSE event: until it arrives nothing has reached the caller, so
`stream_with_failover` may still move to another endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterator
from functools import partial
from typing import Any, NoReturn, cast
from urllib.parse import urlencode

from backends.client.adapters import (
    ALREADY_LOADED,
    ENABLE_HINT,
    LOAD_PATH,
    NOT_LOADED,
    UNLOAD_PATH,
    ResidentAdapters,
    adapter_path,
)
from backends.client.errors import (
    BackendError,
    BackendOverloaded,
    BackendRejected,
    BackendStreamBroken,
    BackendTimeout,
    BackendUnavailable,
    ClientAtCapacity,
)
from backends.client.http import HTTPTransport, Response, TransportError, TransportTimeout
from backends.client.sse import SSEDecoder
from backends.client.types import CompletionChunk, ContextAnswer, Endpoint
from contracts.reject_if_busy import REJECT_IF_BUSY_HEADER
from contracts.request_id import REQUEST_ID_HEADER
from contracts.tokenizer import TOKENIZER_PATH, TokenizerPayload
from contracts.usage import Usage

# After [DONE] a well-behaved backend only ends the body; one that sends more or stalls is cut off.
DRAIN_TIMEOUT_S = 0.25
DRAIN_MAX_EVENTS = 8
AT_CAPACITY_RETRY_AFTER_S = 1.0
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
_SCAN = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # the C scanner `json.loads` ends in


class BackendClient:
    """A pooled HTTP client for OpenAI-compatible backends; make one per process and share it.

    `connect_timeout_s` bounds opening a connection; `first_byte_timeout_s` bounds the time from
    sending a streaming request to its first event; `read_timeout_s` bounds each later read (and
    each wait of a non-streaming answer). `probe_timeout_s` bounds each wait of health, load and
    KV-event polls. At most `max_connections` generation requests (streams and `complete`) are
    open at once: one more raises ClientAtCapacity at once, before anything is sent, rather than
    queueing for a connection; polls are not counted (they are few, one per endpoint and loop),
    so a full client still sees its backends' health. `api_key` is sent as
    `Authorization: Bearer <api_key>` with every request (generation and polls alike), as vLLM's,
    SGLang's and our backends' `--api-key` expect. `transport` replaces the network (tests, or a
    custom transport); it brings its own connect timeout and headers, so it cannot be combined
    with `api_key`.
    """

    def __init__(
        self,
        *,
        connect_timeout_s: float = 2.0,
        first_byte_timeout_s: float = 30.0,
        read_timeout_s: float = 60.0,
        max_connections: int = 256,
        transport: HTTPTransport | None = None,
        probe_timeout_s: float = 2.0,
        api_key: str | None = None,
    ) -> None:
        if transport is not None and api_key is not None:
            raise ValueError("pass the API key to the transport's headers, or no transport: not both")
        self.first_byte_timeout_s = first_byte_timeout_s
        self._read_timeout_s = read_timeout_s
        self._probe_timeout_s = probe_timeout_s
        self.max_connections = max_connections
        self._num_open = 0  # generation requests open now
        headers = {"authorization": f"Bearer {api_key}"} if api_key else None
        # The cap is ours (above); the pool itself never makes a request wait.
        self._http = transport or HTTPTransport(connect_timeout_s=connect_timeout_s, max_connections=0, headers=headers)
        self.adapters = ResidentAdapters()  # LoRA adapters this client loaded on vLLM servers (`load_adapter`)

    @property
    def open_requests(self) -> int:
        """Generation requests open to backends now (at most `max_connections`)."""
        return self._num_open

    async def aclose(self) -> None:
        await self._http.aclose()

    # -- generation -------------------------------------------------------------------------

    async def stream_completion(
        self, endpoint: Endpoint, body: dict[str, Any], request_id: str | None = None
    ) -> AsyncGenerator[CompletionChunk, None]:
        """POST /v1/completions with `stream=True` and usage in `stream_options` (see below).

        `body` is the OpenAI request (prompt as token ids or text, sampling fields, cache_salt,
        ...). Yields text chunks, then a final usage-only chunk (`choices: []`). Raises
        BackendUnavailable / BackendTimeout / BackendOverloaded / BackendRejected before the first
        chunk, BackendStreamBroken after it. `request_id` (the gateway's) goes in `x-request-id`.
        The chunks of `stream_completion_batches`, one at a time.
        """
        batches = self.stream_completion_batches(endpoint, body, request_id)
        try:
            async for batch in batches:
                for chunk in batch:
                    yield chunk
        finally:
            await batches.aclose()

    async def stream_completion_batches(
        self, endpoint: Endpoint, body: dict[str, Any], request_id: str | None = None, *, reject_if_busy: bool = False,
        adapter: str | None = None,
    ) -> AsyncGenerator[list[CompletionChunk], None]:
        """`stream_completion`'s chunks, a list of them per read of the response body (never empty):
        the events that arrived together, handed on in one step instead of one generator step per
        token in every layer above (the gateway's generation and its renderers take them the same way).
        A bad event raises after the good ones before it were yielded, as one at a time would.
        `reject_if_busy`: ask the backend for 429 rather than a place in its queue (contracts/reject_if_busy.py).
        `adapter`: the body's model is this LoRA adapter, which a kind that `loads_adapters` (vLLM) is
        made to load first (`load_adapter`), and again when the server answers that it has no such model
        (it restarted and forgot it)."""
        # continuous_usage_stats (vLLM's extension, also spoken by our backend): the usage so far
        # rides on every chunk, so a stream that ends early still knows its cached prompt tokens
        stream_options = {**(body.get("stream_options") or {}), "include_usage": True, "continuous_usage_stats": True}
        payload = _json_bytes(endpoint.shape({**body, "stream": True, "stream_options": stream_options}))
        with self._open_slot():
            deadline = asyncio.get_running_loop().time() + self.first_byte_timeout_s
            headers = _headers(request_id, reject_if_busy)
            loads = adapter is not None and endpoint.server.loads_adapters
            if adapter is not None and loads:
                await self.adapters.ensure(endpoint, adapter, partial(self.load_adapter, endpoint, adapter))
            try:
                response = await self._send_before_first_byte(endpoint, "/v1/completions", payload, deadline, headers)
            except BackendRejected as exc:
                if adapter is None or not loads or exc.status != 404:
                    raise
                self.adapters.forget(endpoint, adapter)  # the server lost it (a restart): load it again, once
                await self.adapters.ensure(endpoint, adapter, partial(self.load_adapter, endpoint, adapter))
                response = await self._send_before_first_byte(endpoint, "/v1/completions", payload, deadline, headers)
            events = _Events(response.iter_bytes())
            try:
                is_first = True
                while True:
                    await self._read_events(endpoint, events, deadline if is_first else None)
                    batch: list[CompletionChunk] = []
                    while events.ready:
                        data = events.ready.popleft()
                        if data == "[DONE]":
                            if batch:
                                yield batch
                            if not response.release_if_ended():  # usually the body's end came with [DONE]
                                await _drain(events)
                            return
                        try:
                            chunk = CompletionChunk.from_json(_parse_event(endpoint, data, is_first))
                        except Exception:
                            if batch:  # what came before the bad event first
                                yield batch
                            raise
                        is_first = False
                        batch.append(chunk)
                    yield batch
            finally:
                await events.aclose()
                response.close()  # a no-op once drained; else it drops the connection

    async def complete(
        self, endpoint: Endpoint, body: dict[str, Any], request_id: str | None = None
    ) -> tuple[str, str | None, Usage]:
        """POST /v1/completions without streaming; returns (text, finish_reason, usage)."""
        payload = {key: value for key, value in body.items() if key != "stream_options"}
        payload["stream"] = False
        payload = endpoint.shape(payload)
        with self._open_slot():
            response = await self._exchange(
                endpoint, "POST", "/v1/completions", _json_bytes(payload), self._read_timeout_s, _headers(request_id)
            )
        try:
            answer = response.json()
            choice = answer["choices"][0]
            text = choice.get("text")
            if text is None:
                text = (choice.get("message") or {}).get("content") or ""
            return text, choice.get("finish_reason"), Usage.from_json(answer.get("usage") or {})
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise BackendUnavailable(
                f"{endpoint.id} answered /v1/completions with a malformed body", endpoint_id=endpoint.id, answered=True
            ) from exc

    async def embeddings(
        self, endpoint: Endpoint, body: dict[str, Any], request_id: str | None = None
    ) -> tuple[list[list[float]], Usage]:
        """POST /v1/embeddings (OpenAI's and vLLM's shape); returns the vectors in input order and usage."""
        with self._open_slot():
            response = await self._exchange(
                endpoint, "POST", "/v1/embeddings", _json_bytes(body), self._read_timeout_s, _headers(request_id)
            )
        try:
            answer = response.json()
            data = sorted(answer["data"], key=lambda item: item["index"])
            return [item["embedding"] for item in data], Usage.from_json(answer.get("usage") or {})
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise BackendUnavailable(
                f"{endpoint.id} answered /v1/embeddings with a malformed body", endpoint_id=endpoint.id, answered=True
            ) from exc

    async def context(
        self, endpoint: Endpoint, body: dict[str, Any], request_id: str | None = None, *, reject_if_busy: bool = False
    ) -> ContextAnswer:
        """The context step of disaggregated serving: POST /v1/completions with `disaggregated_params:
        {request_type: context_only}`, never streamed (trtllm-serve's protocol). Bounded by the
        first-byte timeout: nothing has reached the client yet, so the caller may still fail over."""
        payload = {key: value for key, value in body.items() if key != "stream_options"}
        payload.update(stream=False, disaggregated_params={"request_type": "context_only"})
        payload = endpoint.shape(payload)
        with self._open_slot():
            response = await self._exchange(
                endpoint, "POST", "/v1/completions", _json_bytes(payload), self.first_byte_timeout_s,
                _headers(request_id, reject_if_busy),
            )
        try:
            return ContextAnswer.from_json(response.json())
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise BackendUnavailable(
                f"{endpoint.id} answered the context step with a malformed body", endpoint_id=endpoint.id, answered=True
            ) from exc

    async def stream_with_failover(
        self,
        endpoints: list[Endpoint],
        body: dict[str, Any],
        on_failure: Callable[[BackendError], None] | None = None,
        request_id: str | None = None,
        *,
        may_try: Callable[[Endpoint], bool] | None = None,
        reject_if_busy: bool = False,
        adapter: str | None = None,
    ) -> tuple[Endpoint, AsyncGenerator[list[CompletionChunk], None]]:
        """Open a stream on the first endpoint that produces a first chunk, trying them in order;
        the stream yields `stream_completion_batches`' lists of chunks.

        Moves on when an endpoint is unavailable, times out or is overloaded before its first
        chunk; a BackendRejected (the request is wrong) is raised at once. When every endpoint
        fails, raises BackendOverloaded if they all were, else the last error. The returned
        iterator starts with the batch that was already read. `on_failure` hears of every error
        an endpoint answered (the gateway's outlier ejection counts them); `may_try` is asked just
        before each endpoint is tried, and one it refuses is passed over (BackendOverloaded when it
        refuses them all). `adapter`: the LoRA adapter the body's model names (`stream_completion_batches`).
        """
        if not endpoints:
            raise BackendUnavailable("no backend endpoints to try")
        failures: list[BackendError] = []
        for endpoint in endpoints:
            if may_try is not None and not may_try(endpoint):
                continue  # e.g. a backend on trial that already has its one trial request
            stream = self.stream_completion_batches(endpoint, body, request_id, reject_if_busy=reject_if_busy,
                                                    adapter=adapter)
            try:
                first = await anext(stream)
            except (BackendUnavailable, BackendTimeout, BackendOverloaded) as exc:
                failures.append(exc)
                await stream.aclose()
                if on_failure is not None:
                    on_failure(exc)
                continue
            except StopAsyncIteration:
                message = f"{endpoint.id} sent [DONE] before any chunk"
                failures.append(BackendUnavailable(message, endpoint_id=endpoint.id, answered=True))
                if on_failure is not None:
                    on_failure(failures[-1])
                continue
            except BaseException:
                await stream.aclose()
                raise
            return endpoint, _Prepended(first, stream)
        if not failures:  # `may_try` refused every endpoint
            raise BackendOverloaded(f"none of the {len(endpoints)} endpoints may take a request now", retry_after_s=1.0)
        if all(isinstance(exc, BackendOverloaded) for exc in failures):
            waits = [exc.retry_after_s for exc in failures if isinstance(exc, BackendOverloaded) and exc.retry_after_s]
            raise BackendOverloaded(
                f"all {len(endpoints)} endpoints are overloaded", retry_after_s=min(waits) if waits else None
            ) from failures[-1]
        summary = "; ".join(f"{exc.endpoint_id}: {exc.message}" for exc in failures)
        last = failures[-1]
        error = type(last)(f"all {len(endpoints)} endpoints failed ({summary})", endpoint_id=last.endpoint_id)
        error.answered = last.answered
        raise error from last

    async def load_adapter(self, endpoint: Endpoint, name: str) -> None:
        """POST /v1/load_lora_adapter: have `endpoint`'s vLLM load LoRA adapter `name` from its `lora_dir`.
        One it already has counts as loaded. A server that cannot load adapters (no --enable-lora, no
        runtime updating, no `lora_dir`, an unreadable directory) is a BackendRejected (400) saying what
        its operator must do; a connection failure or a 503 is the usual BackendUnavailable (fail over)."""
        path = adapter_path(endpoint, name)
        if path is None:
            raise BackendRejected(f"{endpoint.id} has no lora_dir: cannot serve finetunes: {ENABLE_HINT}",
                                  status=400, endpoint_id=endpoint.id)
        body = _json_bytes({"lora_name": name, "lora_path": path})
        try:
            await self._exchange(endpoint, "POST", LOAD_PATH, body, self._read_timeout_s)
        except BackendRejected as exc:
            if exc.status == 400 and ALREADY_LOADED in exc.message:
                return
            raise BackendRejected(f"{endpoint.id} answered 400: cannot serve finetunes: {ENABLE_HINT} "
                                  f"(loading the adapter answered {exc.status})", status=400, endpoint_id=endpoint.id) from exc
        except BackendUnavailable as exc:
            if not exc.answered or "answered 503" in exc.message:
                raise
            raise BackendRejected(f"{endpoint.id} answered 400: cannot serve finetunes: {ENABLE_HINT} "
                                  f"(loading the adapter failed: {exc.message.split(': ', 1)[-1][:300]})",
                                  status=400, endpoint_id=endpoint.id) from exc

    async def unload_adapter(self, endpoint: Endpoint, name: str) -> bool:
        """POST /v1/unload_lora_adapter: have `endpoint`'s server (vLLM or ours) drop LoRA adapter `name`.
        True when it had it, False when it did not (404, "cannot be found"); raises BackendError when it cannot
        be reached or refuses. Either way this client loads it again before its next use there."""
        self.adapters.forget(endpoint, name)
        try:
            await self._exchange(endpoint, "POST", UNLOAD_PATH, _json_bytes({"lora_name": name}), self._read_timeout_s)
        except BackendRejected as exc:
            if exc.status == 404 or NOT_LOADED in exc.message:
                return False
            raise
        return True

    # -- polling ----------------------------------------------------------------------------

    async def health(self, endpoint: Endpoint) -> bool:
        """True when GET /health answers 200 within the probe timeout; never raises."""
        try:
            response = await self._exchange(endpoint, "GET", "/health", None, self._probe_timeout_s)
        except BackendError:
            return False
        return response.status == 200

    async def load(self, endpoint: Endpoint) -> dict[str, Any]:
        """GET /load: our backend's cheap load snapshot (running, waiting, prefill/decode tokens, ...)."""
        answer = await self._get_json(endpoint, "GET", "/load")
        if not isinstance(answer, dict):
            raise BackendUnavailable(f"{endpoint.id} answered /load with a non-object", endpoint_id=endpoint.id)
        return answer

    async def kv_cache_events(self, endpoint: Endpoint, consumer: str | None = None) -> list[dict[str, Any]]:
        """POST /kv_cache_events: the KV events since the last poll, in TensorRT-LLM's shape.

        `consumer` (e.g. the gateway's replica id) names this reader, so our backends keep a cursor
        for it and other readers' polls do not take its events; trtllm-serve ignores it and drains.
        """
        path = "/kv_cache_events" if consumer is None else f"/kv_cache_events?{urlencode({'consumer': consumer})}"
        answer = await self._get_json(endpoint, "POST", path)
        if not isinstance(answer, list):
            raise BackendUnavailable(
                f"{endpoint.id} answered /kv_cache_events with a non-list", endpoint_id=endpoint.id
            )
        return answer

    async def models(self, endpoint: Endpoint) -> list[str]:
        """GET /v1/models: the ids of the models the backend serves."""
        answer = await self._get_json(endpoint, "GET", "/v1/models")
        try:
            return [model["id"] for model in answer["data"]]
        except (KeyError, TypeError) as exc:
            raise BackendUnavailable(
                f"{endpoint.id} answered /v1/models with a malformed body", endpoint_id=endpoint.id, answered=True
            ) from exc

    # -- setup ------------------------------------------------------------------------------

    async def tokenizer(self, endpoint: Endpoint) -> TokenizerPayload:
        """GET /edgerun/v1/tokenizer: our backend's tokenizer payload (`tokenizer_json`,
        `chat_template`, special tokens, `max_model_len`; see `gateway.pipeline.tokenization`)."""
        answer = await self._get_json(endpoint, "GET", TOKENIZER_PATH, self._read_timeout_s)
        if not isinstance(answer, dict) or not isinstance(answer.get("tokenizer_json"), str):
            message = f"{endpoint.id} answered {TOKENIZER_PATH} without tokenizer_json"
            raise BackendUnavailable(message, endpoint_id=endpoint.id)
        return cast(TokenizerPayload, answer)

    # -- internals --------------------------------------------------------------------------

    @contextlib.contextmanager
    def _open_slot(self) -> Iterator[None]:
        """Count one open generation request, or raise ClientAtCapacity (nothing counted)."""
        if self._num_open >= self.max_connections:
            raise ClientAtCapacity(
                f"this gateway already has {self._num_open} requests open to backends (max_connections="
                f"{self.max_connections}: the gateway's backend_max_connections); retry shortly",
                retry_after_s=AT_CAPACITY_RETRY_AFTER_S,
            )
        self._num_open += 1
        try:
            yield
        finally:
            self._num_open -= 1

    async def _exchange(
        self,
        endpoint: Endpoint,
        method: str,
        path: str,
        body: bytes | None,
        timeout_s: float,
        headers: dict[str, str] | None = None,
    ) -> Response:
        """One whole request and answer (each wait bounded by `timeout_s`); raises on a 4xx/5xx."""
        try:
            response = await self._http.request(method, endpoint.url(path), body, timeout_s=timeout_s, headers=headers)
            try:
                await response.read()
            finally:
                response.close()
        except TransportError as exc:
            _raise_transport_error(endpoint, exc)
        _raise_for_status(endpoint, response)
        return response

    async def _get_json(self, endpoint: Endpoint, method: str, path: str, timeout_s: float | None = None) -> Any:
        response = await self._exchange(endpoint, method, path, None, timeout_s or self._probe_timeout_s)
        try:
            return response.json()
        except ValueError as exc:
            message = f"{endpoint.id} answered {path} with invalid JSON"
            raise BackendUnavailable(message, endpoint_id=endpoint.id) from exc

    async def _send_before_first_byte(
        self, endpoint: Endpoint, path: str, body: bytes, deadline: float, headers: dict[str, str] | None
    ) -> Response:
        try:
            async with asyncio.timeout_at(deadline):
                response = await self._http.request(
                    "POST", endpoint.url(path), body, timeout_s=self._read_timeout_s, headers=headers
                )
        except TransportError as exc:
            _raise_transport_error(endpoint, exc)
        except TimeoutError as exc:
            limit = self.first_byte_timeout_s
            message = f"{endpoint.id} sent no response headers within the first-byte timeout ({limit}s)"
            raise BackendTimeout(message, endpoint_id=endpoint.id) from exc
        if response.status >= 400:
            try:
                async with asyncio.timeout_at(deadline):
                    await response.read()
            except (TimeoutError, TransportError):
                pass  # the status alone says enough
            finally:
                response.close()
            _raise_for_status(endpoint, response)
        return response

    async def _read_events(self, endpoint: Endpoint, events: _Events, deadline: float | None) -> None:
        """Read until another SSE payload is ready; before the first one, errors are pre-first-byte errors."""
        is_first = deadline is not None
        try:
            if deadline is None:
                more = await events.read_more()
            else:
                async with asyncio.timeout_at(deadline):
                    more = await events.read_more()
        except TransportError as exc:
            if is_first:
                _raise_transport_error(endpoint, exc)
            raise BackendStreamBroken(f"{endpoint.id} stream broke: {_describe(exc)}", endpoint_id=endpoint.id) from exc
        except TimeoutError as exc:
            message = f"{endpoint.id} sent no first chunk within the first-byte timeout ({self.first_byte_timeout_s}s)"
            raise BackendTimeout(message, endpoint_id=endpoint.id) from exc
        if not more:
            error = BackendUnavailable if is_first else BackendStreamBroken
            raise error(f"{endpoint.id} ended the stream without [DONE]", endpoint_id=endpoint.id, answered=True)


class _Events:
    """The SSE payloads of one response body. `ready` holds those decoded and not yet taken; the
    body is read (an await) only when it is empty, so the events that came in one read are taken
    with no generator step or coroutine call each."""

    def __init__(self, body: AsyncGenerator[bytes, None]) -> None:
        self._body = body
        self._decoder = SSEDecoder()
        self._ended = False
        self.ready: deque[str] = deque()

    async def read_more(self) -> bool:
        """Read until at least one payload is ready; False when the body ended first."""
        while not self.ready:
            if self._ended:
                return False
            try:
                chunk = await anext(self._body)
            except StopAsyncIteration:
                self._ended = True
                self.ready.extend(self._decoder.end())
            else:
                self.ready.extend(self._decoder.feed(chunk))
        return True

    async def aclose(self) -> None:
        await self._body.aclose()


async def _drain(events: _Events) -> None:
    """Read the body past [DONE] to its end, so the transport returns the connection to the pool.

    Bounded in time and events; a backend that goes on sending, stalls or breaks here is left
    alone, and closing the response then drops its connection (the answer was already complete).
    """
    with contextlib.suppress(TimeoutError, TransportError):
        async with asyncio.timeout(DRAIN_TIMEOUT_S):
            for _ in range(DRAIN_MAX_EVENTS):
                if not await events.read_more():
                    return
                events.ready.popleft()


Batch = list[CompletionChunk]


class _Prepended(AsyncGenerator[Batch, None]):
    """`first`, then `rest`'s batches. Each later step is `rest`'s own awaitable, handed on as it is:
    a generator wrapping `rest` would add a resume to every step of every stream."""

    def __init__(self, first: Batch, rest: AsyncGenerator[Batch, None]) -> None:
        self._first: Batch | None = first
        self._rest = rest

    def __anext__(self) -> Coroutine[Any, Any, Batch]:
        return self.asend(None)

    def asend(self, value: None) -> Coroutine[Any, Any, Batch]:
        first, self._first = self._first, None
        return _ready(first) if first is not None else self._rest.asend(value)

    def athrow(self, typ: Any, val: Any = None, tb: Any = None, /) -> Coroutine[Any, Any, Batch]:
        self._first = None
        return self._rest.athrow(typ, val, tb)

    async def aclose(self) -> None:
        self._first = None
        await self._rest.aclose()


async def _ready(batch: Batch) -> Batch:
    return batch


def _headers(request_id: str | None, reject_if_busy: bool = False) -> dict[str, str] | None:
    headers = {REQUEST_ID_HEADER: request_id} if request_id else {}
    if reject_if_busy:
        headers[REJECT_IF_BUSY_HEADER] = "1"
    return headers or None


def _parse_event(endpoint: Endpoint, data: str, is_first: bool) -> dict[str, Any]:
    """Decode one SSE payload; an error event raises (as a status error before the first chunk)."""
    try:
        event = _json_value(data)
    except ValueError as exc:
        error = BackendUnavailable if is_first else BackendStreamBroken
        message = f"{endpoint.id} sent an invalid SSE payload: {data[:200]!r}"
        raise error(message, endpoint_id=endpoint.id, answered=True) from exc
    if not isinstance(event, dict):
        raise BackendStreamBroken(f"{endpoint.id} sent a non-object SSE payload", endpoint_id=endpoint.id, answered=True)
    if "error" in event or event.get("object") == "error":
        inner = event.get("error")
        body: dict[str, Any] = inner if isinstance(inner, dict) else event
        message = str(body.get("message") or body)
        code = body.get("code")
        if is_first and isinstance(code, int):
            _raise_status(endpoint, code, message, retry_after_s=None)
        raise BackendStreamBroken(f"{endpoint.id} stream failed: {message}", endpoint_id=endpoint.id, answered=True)
    return event


def _json_value(data: str) -> Any:
    """`json.loads(data)` for one event of every chunk: the C scanner straight away, and `json.loads`
    itself (same value, same errors) for whatever the scanner does not take whole (whitespace around
    the value, a byte-order mark, trailing data, invalid JSON)."""
    try:
        value, end = _SCAN(data, 0)
    except StopIteration:
        return json.loads(data)
    return value if end == len(data) else json.loads(data)


def _json_bytes(payload: dict[str, Any]) -> bytes:
    return _ENCODER.encode(payload).encode()  # json.dumps with options would build an encoder per call


def _raise_transport_error(endpoint: Endpoint, exc: TransportError) -> NoReturn:
    if isinstance(exc, TransportTimeout):
        message = f"{endpoint.id} timed out: {_describe(exc)}"
        raise BackendTimeout(message, endpoint_id=endpoint.id, late=exc.late) from exc
    raise BackendUnavailable(f"{endpoint.id} unreachable: {_describe(exc)}", endpoint_id=endpoint.id) from exc


def _raise_for_status(endpoint: Endpoint, response: Response) -> None:
    if response.status < 400:
        return
    _raise_status(endpoint, response.status, _error_message(response), _retry_after(response))


def _raise_status(endpoint: Endpoint, status: int, message: str, retry_after_s: float | None) -> NoReturn:
    text = f"{endpoint.id} answered {status}: {message}"
    if status == 429:
        raise BackendOverloaded(text, retry_after_s=retry_after_s, endpoint_id=endpoint.id)
    if 400 <= status < 500:
        raise BackendRejected(text, status=status, endpoint_id=endpoint.id)
    raise BackendUnavailable(text, endpoint_id=endpoint.id, answered=True)


def _error_message(response: Response) -> str:
    """The message of an OpenAI ({"error": {"message"}}) or trtllm-serve ({"message"}) error body
    (read, or empty when it could not be read)."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:500] or response.reason
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        for key in ("message", "detail", "error"):
            if body.get(key):
                return str(body[key])
    return str(body)[:500]


def _retry_after(response: Response) -> float | None:
    try:
        return max(0.0, float(response.headers["retry-after"]))
    except (KeyError, ValueError):
        return None


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
