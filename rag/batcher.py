"""Auto-batching with no idle latency, in-flight de-duplication, an LRU cache and a bounded queue.

An idle batcher sends a lone query to a worker thread at once. While batches compute, new
queries wait in the queue and leave together as the next batch (up to ``max_batch_size``) when a
worker frees up, so batches grow with load instead of with a timer. A worker that finishes takes
the next batch itself and hands its answers to the event loop, so it never waits for the loop.
``workers`` threads compute batches side by side (on CPU two single-threaded forwards beat one
two-threaded forward, and do not stall each other when the event loop takes a core); the event
loop keeps accepting requests meanwhile. A query already queued or computing is joined, not
recomputed, and finished answers stay in an LRU cache (RL asks each question n times). Each answer
is serialised to JSON once, in the worker thread, and kept as bytes beside the list, so a cache
hit or a joined duplicate costs the event loop no serialisation at all.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from rag.errors import Overloaded

logger = logging.getLogger(__name__)

Results = list[dict[str, Any]]
Compute = Callable[[list[str], int], list[Results]]


@dataclass(frozen=True)
class Answer:
    """One query's passages and their JSON array, serialised once."""

    results: Results
    json: bytes


def _to_json(value: Any) -> bytes:
    import pydantic_core

    return pydantic_core.to_json(value)


@dataclass
class _Item:
    """One query to compute and every caller waiting for it.

    Each caller waits on its own future, so one caller giving up cancels only its own wait.
    """

    query: str
    top_k: int
    waiters: list[asyncio.Future[Answer]]

    def resolve(self, answer: Answer | None = None, error: BaseException | None = None) -> None:
        for future in self.waiters:
            if future.done():
                continue
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(answer)  # type: ignore[arg-type]


class _LRU:
    """Least-recently-used answers, bounded by the number of passages held."""

    def __init__(self, max_passages: int) -> None:
        self.max_passages = max_passages
        self.passages = 0
        self._items: OrderedDict[tuple[str, int], Answer] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: tuple[str, int]) -> Answer | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: tuple[str, int], value: Answer) -> None:
        if self.max_passages <= 0 or key in self._items:
            return
        self._items[key] = value
        self.passages += max(1, len(value.results))
        while self.passages > self.max_passages and self._items:
            _, old = self._items.popitem(last=False)
            self.passages -= max(1, len(old.results))


@dataclass
class BatcherStats:
    """Counters for ``/metrics``."""

    queries: int = 0
    cache_hits: int = 0
    deduplicated: int = 0
    computed: int = 0
    batches: int = 0
    rejected: int = 0
    failed_batches: int = 0
    compute_seconds: float = 0.0


class Batcher:
    """Turns concurrent ``retrieve`` calls into batched ``compute(queries, top_k)`` calls on worker threads.

    ``compute`` must return one result list per query, best first, with at least ``top_k`` entries
    where the corpus has them; a batch mixing several ``top_k`` is computed at the largest and cut.
    With ``workers`` above 1 it is called from several threads at once and must be thread-safe; a
    second batch starts beside a running one only when at least ``parallel_min_batch`` queries wait
    (fewer are served sooner by joining the next batch than by a batch of their own at half the threads).
    """

    def __init__(self, compute: Compute, *, max_batch_size: int = 128, max_queue: int = 4096,
                 cache_passages: int = 100_000, retry_after: int = 1, workers: int = 1, parallel_min_batch: int = 8,
                 on_batch: Callable[[int, float], None] | None = None) -> None:
        if max_batch_size < 1 or max_queue < 1 or workers < 1:
            raise ValueError("max_batch_size, max_queue and workers must be at least 1")
        self._compute = compute
        self.max_batch_size = max_batch_size
        self.max_queue = max_queue
        self.retry_after = retry_after
        self.workers = workers
        self.parallel_min_batch = parallel_min_batch
        self._on_batch = on_batch
        self._cache = _LRU(cache_passages)
        self._pending: deque[_Item] = deque()
        self._inflight: dict[tuple[str, int], _Item] = {}
        # One thread per worker, the lowest free one first: a lone query always runs on worker 0, so one OpenMP
        # team does the work instead of two taking turns (an idle team spins and steals the other's cores).
        self._executors = [ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"rag-compute-{i}")
                           for i in range(workers)]
        self._free_workers = list(range(workers))
        self._lock = threading.Lock()  # the queue, the free workers and the counts: the loop and the workers take work
        self._tasks: set[asyncio.Task[None]] = set()
        self._computing = 0
        self.stats = BatcherStats()

    @property
    def _busy(self) -> int:
        """Workers computing a batch now."""
        return self.workers - len(self._free_workers)

    @property
    def queue_depth(self) -> int:
        """Queries waiting for a batch (not counting those computing)."""
        return len(self._pending)

    @property
    def computing(self) -> int:
        """Queries in the batches now computing (0 when idle)."""
        return self._computing

    @property
    def cache_entries(self) -> int:
        """Answers held in the cache."""
        return len(self._cache)

    async def retrieve(self, queries: Sequence[str], top_k: int) -> list[Results]:
        """Answers for ``queries`` in order; raises ``Overloaded`` (admitting none) when the queue is full."""
        return [a.results for a in await self.answers(queries, top_k)]

    async def answers(self, queries: Sequence[str], top_k: int) -> list[Answer]:
        """Like ``retrieve``, with each answer's JSON bytes (what the server sends)."""
        found: list[Answer | _Item] = []
        new: dict[tuple[str, int], _Item] = {}
        hits = joins = 0
        for query in queries:
            key = (query, top_k)
            cached = self._cache.get(key)
            if cached is not None:
                found.append(cached)
                hits += 1
                continue
            item = self._inflight.get(key) or new.get(key)
            if item is None:
                item = new[key] = _Item(query, top_k, [])
            else:
                joins += 1
            found.append(item)
        if new and len(self._pending) + len(new) > self.max_queue:
            self.stats.rejected += len(queries)
            raise Overloaded(len(self._pending), self.max_queue, self.retry_after)
        self.stats.queries += len(queries)
        self.stats.cache_hits += hits
        self.stats.deduplicated += joins
        if not new and hits == len(found):
            return found  # type: ignore[return-value]  # every one a cache hit
        loop = asyncio.get_running_loop()
        waits: list[Answer | asyncio.Future[Answer]] = []
        for entry in found:
            if isinstance(entry, Answer):
                waits.append(entry)
            else:
                future = loop.create_future()
                entry.waiters.append(future)
                waits.append(future)
        with self._lock:
            for key, item in new.items():
                self._inflight[key] = item
                self._pending.append(item)
        if new:
            self._dispatch()
        return [w if isinstance(w, Answer) else await w for w in waits]

    def _compute_answers(self, queries: list[str], top_ks: list[int]) -> list[Answer]:
        """Worker thread: one compute at the largest ``top_k``, each answer cut to its own and serialised."""
        results = self._compute(queries, max(top_ks))
        if len(results) != len(queries):
            raise RuntimeError(f"retriever returned {len(results)} answers for {len(queries)} queries")
        return [Answer(r[:k], _to_json(r[:k])) for r, k in zip(results, top_ks, strict=True)]

    def _take_locked(self, worker: int | None = None) -> tuple[int, list[_Item]] | None:
        """Under ``_lock``: the next batch and its worker, or None.

        ``worker`` has just finished a batch and asks for more; it rejoins the free workers when there is none.
        """
        if worker is not None:
            self._free_workers.append(worker)
        if not self._pending or not self._free_workers:
            return None
        if self._busy and len(self._pending) < self.parallel_min_batch:
            return None  # a small batch waits for the running one rather than halve its threads
        chosen = worker if worker is not None else min(self._free_workers)
        self._free_workers.remove(chosen)
        batch = [self._pending.popleft() for _ in range(min(self.max_batch_size, len(self._pending)))]
        self._computing += len(batch)
        return chosen, batch

    def _dispatch(self) -> None:
        """Start a batch on every free worker while queries wait (the event loop's side)."""
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                taken = self._take_locked()
            if taken is None:
                return
            task = loop.create_task(self._run(*taken))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, worker: int, batch: list[_Item]) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executors[worker], self._work, worker, batch, loop)

    def _work(self, worker: int, batch: list[_Item] | None, loop: asyncio.AbstractEventLoop) -> None:
        """Worker thread: compute ``batch``, hand its answers to the loop, then go on with what waits.

        The next batch is taken here, not by the event loop, so a worker does not sit idle until a
        loop busy with the last batch's responses gets round to starting it.
        """
        while batch:
            start = time.perf_counter()
            answers: list[Answer] | None = None
            error: BaseException | None = None
            try:
                answers = self._compute_answers([i.query for i in batch], [i.top_k for i in batch])
            except BaseException as e:  # noqa: BLE001 - every waiter must hear about it
                error = e
            fatal = error is not None and not isinstance(error, Exception)
            with self._lock:
                self._computing -= len(batch)
                if fatal:
                    self._free_workers.append(worker)
                    follow = None
                else:
                    taken = self._take_locked(worker)
                    follow = taken[1] if taken else None
            loop.call_soon_threadsafe(self._settle, batch, answers, error, time.perf_counter() - start)
            if fatal:
                raise error  # type: ignore[misc]
            batch = follow

    def _settle(self, batch: list[_Item], answers: list[Answer] | None, error: BaseException | None,
                elapsed: float) -> None:
        """Event loop: record a finished batch, cache its answers and wake its waiters."""
        if error is not None or answers is None:
            self.stats.failed_batches += 1
            logger.error("retrieval batch of %d failed", len(batch), exc_info=error)
            failure = error if isinstance(error, Exception) else RuntimeError("retrieval worker stopped")
            for item in batch:
                self._inflight.pop((item.query, item.top_k), None)
                item.resolve(error=failure)
            return
        self.stats.batches += 1
        self.stats.computed += len(batch)
        self.stats.compute_seconds += elapsed
        if self._on_batch is not None:
            self._on_batch(len(batch), elapsed)
        for item, answer in zip(batch, answers, strict=True):
            key = (item.query, item.top_k)
            self._cache.put(key, answer)
            self._inflight.pop(key, None)
            item.resolve(answer)

    async def drain(self, timeout: float | None = None) -> None:
        """Wait until queued and computing queries are answered (shutdown finishes work in flight)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while self._tasks:  # a finishing batch starts the next one, so look again until none runs
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                logger.warning("retrieval queue did not drain in %.0f s; %d queries dropped", timeout or 0,
                               len(self._pending) + self._computing)
                return
            await asyncio.wait(set(self._tasks), timeout=left)

    def close(self) -> None:
        """Stop the worker threads (after ``drain``)."""
        for executor in self._executors:
            executor.shutdown(wait=False, cancel_futures=True)
