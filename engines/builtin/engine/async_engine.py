"""The built-in engine behind the `engines.base.Engine` protocol, for asyncio servers.

One dedicated worker thread owns the `LLMEngine` and runs its steps (torch releases the GIL
while it computes, so the event loop stays responsive). The event loop never touches engine
state: it sends commands (add, abort, stop) through a lock-protected queue that the worker
drains at the top of every step, and the worker hands each step's outputs back with
`loop.call_soon_threadsafe` into one `asyncio.Queue` per request. The worker sleeps on a
condition variable while there is nothing to do.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from engines.base import EngineStats, GenerationOutput, GenerationRequest, KVCacheEvent
from engines.builtin.config import EngineConfig
from engines.builtin.engine.kv_handoff import ImportPlan, finish_import, reserve_import
from engines.builtin.engine.llm_engine import LLMEngine
from engines.builtin.runner.model_runner import ModelRunner
from engines.errors import EngineError, EngineStopped, InvalidRequest

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Add:
    request: GenerationRequest


@dataclass(slots=True)
class _Abort:
    request_id: str
    done: asyncio.Future[None] | None = None


@dataclass(slots=True)
class _Call:
    fn: Callable[[LLMEngine], Any]  # run on the worker thread; its result (or error) resolves `done`
    done: asyncio.Future[Any]


@dataclass(slots=True)
class _Stop:
    deadline: float  # time.monotonic() after which unfinished requests are aborted


@dataclass(slots=True)
class _Failed:
    request_id: str
    error: EngineError


class AsyncEngine:
    """`Engine` implementation of the built-in PyTorch engine.

    `AsyncEngine(config)` loads the model; `AsyncEngine(config, runner=...)` reuses a loaded
    `ModelRunner`. Call `await start()` inside the running event loop before `generate()`.
    """

    def __init__(self, config: EngineConfig, runner: ModelRunner | None = None) -> None:
        self.engine = LLMEngine(config, runner)
        self.model_name = self.engine.model_name
        self.tokenizer = self.engine.tokenizer
        self.max_model_len = self.engine.max_model_len
        self._commands: deque[_Add | _Abort | _Call | _Stop] = deque()
        self._wakeup = threading.Condition()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queues: dict[str, asyncio.Queue[GenerationOutput | EngineError]] = {}  # event-loop owned
        self._stats = self.engine.stats()  # snapshot published by the worker
        self._accepting = False
        self._worker_exited = False

    # ---- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._accepting = True
        self._worker_exited = False
        self._thread = threading.Thread(target=self._run, name="edgerun-engine", daemon=True)
        self._thread.start()

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Let in-flight requests finish for up to `timeout_s`, abort the rest, join the thread."""
        self._accepting = False
        thread = self._thread
        if thread is None:
            return
        self._send(_Stop(time.monotonic() + timeout_s))
        await asyncio.to_thread(thread.join)
        self._thread = None
        await asyncio.sleep(0)  # let the last deliveries (scheduled by the worker) run

    # ---- requests --------------------------------------------------------------------------

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        """Yield output deltas until the request finishes. Leaving early aborts it."""
        if not self._accepting:
            raise EngineStopped("the engine is not running (not started, or shutting down)")
        self.engine.validate(request)  # reads fixed config only: safe from this thread
        await self.may_compile_grammar(request)
        queue = self._open_queue(request)
        self._send(_Add(request))
        async for output in self._follow(request.request_id, queue):
            yield output

    async def generate_imported(
        self, request: GenerationRequest, first_token_id: int, fill: Callable[[ImportPlan], Awaitable[None]]
    ) -> AsyncIterator[GenerationOutput]:
        """Like `generate`, for a prompt whose KV was computed elsewhere (kv_handoff.py): blocks are
        reserved (own prefix cache first), `fill(plan)` writes the missing ones while the engine
        keeps stepping, then generation goes on from `first_token_id`, which is the first output."""
        if not self._accepting:
            raise EngineStopped("the engine is not running (not started, or shutting down)")
        self.engine.validate(request)
        await self.may_compile_grammar(request)
        queue = self._open_queue(request)
        request_id = request.request_id
        try:
            plan = await self.call(lambda engine: reserve_import(engine, request))
            await fill(plan)
            first = await self.call(lambda engine: finish_import(engine, request_id, first_token_id))
        except BaseException:
            self._queues.pop(request_id, None)
            self._send(_Abort(request_id))
            raise
        try:
            yield first
        except BaseException:  # the consumer left at the first output
            self._queues.pop(request_id, None)
            if not first.is_finished:
                self._send(_Abort(request_id))
            raise
        if first.is_finished:
            self._queues.pop(request_id, None)
            return
        async for output in self._follow(request_id, queue):
            yield output

    async def may_compile_grammar(self, request: GenerationRequest) -> None:
        """Compile a guided request's grammar on a worker thread (cached by guide), so neither the
        event loop nor the engine's step waits for it; a bad schema raises InvalidRequest here."""
        if request.sampling.guide is not None:
            await asyncio.to_thread(self.engine.grammars.compile, request.sampling.guide)

    def post(self, fn: Callable[[LLMEngine], Any]) -> None:
        """Queue `fn(engine)` for the worker thread without waiting: it runs before any request or
        call sent after it (commands run in order, between steps). Its failure is logged."""
        if self._thread is None:
            raise EngineStopped("the engine is not running")
        done = asyncio.get_running_loop().create_future()
        done.add_done_callback(_log_failure)
        self._send(_Call(fn, done))

    async def call(self, fn: Callable[[LLMEngine], Any]) -> Any:
        """Run `fn(engine)` on the worker thread between steps; returns its result or raises its error."""
        if self._thread is None:
            raise EngineStopped("the engine is not running")
        done = asyncio.get_running_loop().create_future()
        self._send(_Call(fn, done))
        return await done

    def _open_queue(self, request: GenerationRequest) -> asyncio.Queue[GenerationOutput | EngineError]:
        if request.request_id in self._queues:
            raise InvalidRequest(f"request id {request.request_id!r} is already in use")
        queue: asyncio.Queue[GenerationOutput | EngineError] = asyncio.Queue()
        self._queues[request.request_id] = queue
        return queue

    async def _follow(
        self, request_id: str, queue: asyncio.Queue[GenerationOutput | EngineError]
    ) -> AsyncIterator[GenerationOutput]:
        is_done = False
        try:
            while True:
                item = await queue.get()
                if isinstance(item, EngineError):
                    is_done = True
                    raise item
                is_done = item.is_finished
                yield item
                if is_done:
                    return
        finally:
            self._queues.pop(request_id, None)
            if not is_done:  # consumer left (break, cancel, aclose): free the blocks before the next step
                self._send(_Abort(request_id))
                while not queue.empty():  # a final output nobody will read may hold pinned KV
                    item = queue.get_nowait()
                    if isinstance(item, GenerationOutput):
                        self._may_release_pin(item)

    async def abort(self, request_id: str) -> None:
        """Abort `request_id` and return once its blocks are free (no-op if unknown)."""
        if self._thread is None or not self._thread.is_alive():
            return
        done = asyncio.get_running_loop().create_future()
        self._send(_Abort(request_id, done))
        await done

    def stats(self) -> EngineStats:
        return self._stats

    def drain_kv_events(self) -> list[KVCacheEvent]:
        return self.engine.drain_kv_events()

    # ---- worker thread ---------------------------------------------------------------------

    def _may_release_pin(self, output: GenerationOutput) -> None:
        """A context step whose caller left: nobody will export its pinned KV, so give it back."""
        if output.kv_pin is not None and self._loop is not None:
            pin_id = output.kv_pin.pin_id
            self._send(_Call(lambda engine: engine.pins.release(pin_id), self._loop.create_future()))

    def _send(self, command: _Add | _Abort | _Call | _Stop) -> None:
        with self._wakeup:
            if not self._worker_exited:
                self._commands.append(command)
                self._wakeup.notify()
                return
        if isinstance(command, _Abort) and command.done is not None:  # nothing left to abort
            command.done.set_result(None)
        elif isinstance(command, _Call):
            command.done.set_exception(EngineStopped("the engine stopped"))

    def _run(self) -> None:
        loop = self._loop
        assert loop is not None, "start() sets the loop before it starts this thread"
        deadline: float | None = None
        try:
            while True:
                outputs: list[GenerationOutput | _Failed] = []
                acks: list[asyncio.Future[None]] = []
                for command in self._take_commands():
                    if isinstance(command, _Stop):
                        deadline = command.deadline
                    elif isinstance(command, _Call):
                        self._call_soon(_resolve, command.done, *_run_call(command.fn, self.engine))
                    elif isinstance(command, _Abort):
                        output = self.engine.abort(command.request_id)
                        outputs += [output] if output is not None else []
                        acks += [command.done] if command.done is not None else []
                    else:
                        outputs += self._add(command.request)
                if outputs or acks:  # before the step: aborted requests' blocks are already free
                    self._publish(outputs, acks)
                if deadline is not None and (not self.engine.has_unfinished or time.monotonic() >= deadline):
                    self._publish(self.engine.abort_all())
                    return
                self._publish(self._step())
        except _LoopClosed:
            log.warning("event loop closed under the engine thread; stopping it")
        finally:
            self.engine.runner.close()  # its step workers, which this thread started
            with self._wakeup:
                self._worker_exited = True
                leftover = list(self._commands)
                self._commands.clear()
            acks = [c.done for c in leftover if isinstance(c, _Abort) and c.done is not None]
            calls = [c.done for c in leftover if isinstance(c, _Call)]
            with contextlib.suppress(RuntimeError):
                for done in calls:
                    loop.call_soon_threadsafe(_resolve, done, None, EngineStopped("the engine stopped"))
            with contextlib.suppress(RuntimeError):  # wake anyone still waiting: no more outputs will come
                loop.call_soon_threadsafe(self._deliver, [], acks, EngineStopped("the engine stopped"))

    def _take_commands(self) -> list[_Add | _Abort | _Call | _Stop]:
        with self._wakeup:
            while not self._commands and not self.engine.has_unfinished:
                self._wakeup.wait()
            commands = list(self._commands)
            self._commands.clear()
        return commands

    def _add(self, request: GenerationRequest) -> list[_Failed]:
        try:
            self.engine.add_request(request)
        except EngineError as exc:
            return [_Failed(request.request_id, exc)]
        except Exception as exc:  # a malformed request object: refuse it, keep serving others
            return [_Failed(request.request_id, InvalidRequest(f"bad request: {exc}"))]
        return []

    def _step(self) -> Sequence[GenerationOutput | _Failed]:
        try:
            return self.engine.step()
        except Exception as exc:  # a failed forward must not leave requests hanging forever
            log.exception("engine step failed; failing its requests")
            failed = self.engine.abort_all()
            return [_Failed(o.request_id, EngineError(f"generation failed: {exc}")) for o in failed]

    def _publish(self, outputs: Sequence[GenerationOutput | _Failed], acks: Sequence[asyncio.Future[None]] = ()) -> None:
        self._stats = self.engine.stats()
        if outputs or acks:
            self._call_soon(self._deliver, outputs, acks)

    def _call_soon(self, callback: Callable[..., None], *args: object) -> None:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError as exc:  # the loop is closed: nobody is listening any more
            self.engine.abort_all()
            raise _LoopClosed from exc

    def _deliver(
        self, outputs: Sequence[GenerationOutput | _Failed], acks: Sequence[asyncio.Future[None]], to_all: EngineError | None = None
    ) -> None:
        for output in outputs:
            queue = self._queues.get(output.request_id)
            if queue is not None:
                queue.put_nowait(output.error if isinstance(output, _Failed) else output)
            elif isinstance(output, GenerationOutput):
                self._may_release_pin(output)
        for ack in acks:
            if not ack.done():
                ack.set_result(None)
        if to_all is not None:
            for queue in self._queues.values():
                queue.put_nowait(to_all)


class _LoopClosed(Exception):
    pass


def _run_call(fn: Callable[[LLMEngine], Any], engine: LLMEngine) -> tuple[Any, BaseException | None]:
    try:
        return fn(engine), None
    except Exception as exc:  # handed to the caller on the event loop
        return None, exc


def _resolve(done: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if done.done():
        return
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(result)


def _log_failure(done: asyncio.Future[Any]) -> None:
    if not done.cancelled() and done.exception() is not None:
        log.error("a posted engine call failed", exc_info=done.exception())
