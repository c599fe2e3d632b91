"""Where and when the engine's work runs, so that no request holds the event loop or another session.

- Work whose size is bounded small (the body, the session's journal and the capsules together under
  `INLINE_COST`) runs inline on the loop: a thread hop would cost more CPU than the work itself.
- Anything bigger runs on a small pool of engine threads (`EnginePool`), taken in fair order: each
  client's jobs are queued by the bytes of work it has asked for (start-time fair queueing), so one
  client's 12 MB body and its backlog keep another client's 400 KB turn waiting at most for the jobs
  already running, never for the backlog.
- The turns of one session are ordered by an asyncio lock per session (`SessionGates`): a small turn
  waits on the loop, without blocking it, while the same session's big turn runs on a thread.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import itertools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any, TypeVar

T = TypeVar("T")

# Work below this many bytes (body + journal + capsules) runs inline: ~2 ms of engine time at most on this
# hardware, less than a thread hop's share of CPU for the thousands of small turns a second a proxy serves.
INLINE_COST = 256 * 1024
# Two threads on a 2-core box: tiktoken and hashing release the GIL, so a second thread lets a victim's
# turn run beside a big one instead of behind it (bench/stall.py measures both).
ENGINE_THREADS = 2
_FORGET_CLIENTS_PAST = 4096  # virtual finish tags kept per client, pruned to the clients still ahead


class _Job:
    __slots__ = ("cancelled", "future", "started", "work")

    def __init__(self, work: Callable[[], Any], future: asyncio.Future[Any]) -> None:
        self.work = work
        self.future = future
        self.started = False
        self.cancelled = False


class EnginePool:
    """Engine work: inline when small, else on `threads` threads in start-time fair order per client."""

    def __init__(self, threads: int = ENGINE_THREADS) -> None:
        self.threads = max(1, threads)
        self._executor: ThreadPoolExecutor | None = None  # made on first use: most services never need it
        self._queue: list[tuple[float, int, float, _Job]] = []  # (finish tag, arrival, start tag, job)
        self._finish: dict[str, float] = {}  # each client's last virtual finish tag
        self._clock = 0.0  # virtual time: the start tag of the job dispatched last
        self._running = 0
        self._arrivals = itertools.count()

    @property
    def queued(self) -> int:
        return len(self._queue)

    async def run(self, work: Callable[[], T], *, cost: int, client: str) -> T:
        """`work()`'s result: inline when `cost` is under INLINE_COST, else from an engine thread.

        A caller cancelled while its work runs on a thread waits for it to end before the cancellation
        goes on, so whatever it holds (a session's gate) is held as long as the work runs.
        """
        if cost < INLINE_COST:
            return work()
        job = _Job(work, asyncio.get_running_loop().create_future())
        start = max(self._clock, self._finish.get(client, 0.0))
        self._finish[client] = start + cost
        heapq.heappush(self._queue, (start + cost, next(self._arrivals), start, job))
        self._dispatch()
        try:
            return await asyncio.shield(job.future)
        except asyncio.CancelledError:
            job.cancelled = True
            while job.started and not job.future.done():
                try:
                    await asyncio.wait((job.future,))
                except asyncio.CancelledError:
                    continue
            raise

    def _dispatch(self) -> None:
        loop = asyncio.get_running_loop()
        while self._running < self.threads and self._queue:
            _, _, start, job = heapq.heappop(self._queue)
            if job.cancelled:
                continue
            self._clock = start
            job.started = True
            self._running += 1
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="context-engine")
            done = loop.run_in_executor(self._executor, job.work)
            done.add_done_callback(functools.partial(self._finished, job))
        if len(self._finish) > _FORGET_CLIENTS_PAST:  # a client behind the clock starts at the clock anyway
            self._finish = {client: tag for client, tag in self._finish.items() if tag > self._clock}

    def _finished(self, job: _Job, finished: asyncio.Future[Any]) -> None:
        self._running -= 1
        if not job.future.done():
            if finished.cancelled():
                job.future.cancel()
            elif (error := finished.exception()) is not None:
                job.future.set_exception(error)
            else:
                job.future.set_result(finished.result())
        self._dispatch()

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False)


class _Gate:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


class SessionGates:
    """An asyncio lock per session key, made when a turn needs it and gone when no turn holds or awaits it."""

    def __init__(self) -> None:
        self._gates: dict[str, _Gate] = {}

    def __len__(self) -> int:
        return len(self._gates)

    def held(self, key: str) -> _Held:
        return _Held(self, key)


class _Held:
    __slots__ = ("gate", "gates", "key")

    def __init__(self, gates: SessionGates, key: str) -> None:
        self.gates, self.key = gates, key
        self.gate: _Gate | None = None

    async def __aenter__(self) -> None:
        gates = self.gates._gates
        gate = gates.get(self.key)
        if gate is None:
            gate = gates[self.key] = _Gate()
        gate.users += 1
        self.gate = gate
        try:
            await gate.lock.acquire()
        except BaseException:
            self._leave(gate)
            raise

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        gate = self.gate
        assert gate is not None
        gate.lock.release()
        self._leave(gate)

    def _leave(self, gate: _Gate) -> None:
        gate.users -= 1
        if not gate.users:
            self.gates._gates.pop(self.key, None)
