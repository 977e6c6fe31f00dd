"""The auto-batcher on its own: no idle wait, batches formed while one computes, dedup, cache, bounded queue."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from rag.batcher import Batcher
from rag.errors import Overloaded


class GatedCompute:
    """A compute function that records its batches and can be held until the test releases it."""

    def __init__(self, hold_first: bool = False) -> None:
        self.batches: list[tuple[list[str], int]] = []
        self.called_at: list[float] = []
        self.gate = threading.Event()
        self.entered = threading.Event()
        if not hold_first:
            self.gate.set()

    def __call__(self, queries: list[str], top_k: int) -> list[list[dict]]:
        self.called_at.append(time.perf_counter())
        self.batches.append((list(queries), top_k))
        self.entered.set()
        self.gate.wait(10)
        return [[{"id": f"{q}#{i}", "title": "", "contents": q, "score": 1.0 - i / 10} for i in range(top_k)]
                for q in queries]


async def _until(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.001)


async def test_lone_query_is_computed_at_once() -> None:
    compute = GatedCompute()
    batcher = Batcher(compute)
    start = time.perf_counter()
    [answer] = await batcher.retrieve(["alone"], 2)
    assert [r["id"] for r in answer] == ["alone#0", "alone#1"]
    # No batching window: the worker starts as soon as the request arrives.
    assert compute.called_at[0] - start < 0.05
    assert compute.batches == [(["alone"], 2)]
    batcher.close()


async def test_queries_arriving_during_a_batch_form_the_next_batches_even_while_the_loop_is_busy() -> None:
    compute = GatedCompute(hold_first=True)
    batcher = Batcher(compute, max_batch_size=4)
    first = asyncio.ensure_future(batcher.retrieve(["q0"], 1))
    await _until(compute.entered.is_set)
    later = [asyncio.ensure_future(batcher.retrieve([f"q{i}"], 1)) for i in range(1, 7)]
    await _until(lambda: batcher.queue_depth == 6)
    compute.gate.set()
    time.sleep(0.3)  # the loop is blocked (as by a burst of responses): the worker takes the next batches itself
    assert [b[0] for b in compute.batches] == [["q0"], ["q1", "q2", "q3", "q4"], ["q5", "q6"]]
    await asyncio.gather(first, *later)
    assert batcher.stats.batches == 3 and batcher.stats.computed == 7 and batcher.computing == 0
    batcher.close()


async def test_identical_queries_in_flight_are_computed_once_then_cached() -> None:
    compute = GatedCompute(hold_first=True)
    batcher = Batcher(compute)
    waiters = [asyncio.ensure_future(batcher.retrieve(["same"], 3)) for _ in range(8)]
    await _until(compute.entered.is_set)
    compute.gate.set()
    answers = await asyncio.gather(*waiters)
    assert all(a == answers[0] for a in answers)
    assert compute.batches == [(["same"], 3)]
    assert batcher.stats.deduplicated == 7

    again = await batcher.retrieve(["same", "same"], 3)
    assert again == [answers[0][0], answers[0][0]]
    assert len(compute.batches) == 1 and batcher.stats.cache_hits == 2
    # Another top_k is another answer.
    await batcher.retrieve(["same"], 1)
    assert compute.batches[-1] == (["same"], 1)
    batcher.close()


async def test_mixed_top_k_in_one_batch_is_cut_per_request() -> None:
    compute = GatedCompute(hold_first=True)
    batcher = Batcher(compute)
    first = asyncio.ensure_future(batcher.retrieve(["warm"], 1))
    await _until(compute.entered.is_set)
    small = asyncio.ensure_future(batcher.retrieve(["a"], 1))
    big = asyncio.ensure_future(batcher.retrieve(["b"], 5))
    await _until(lambda: batcher.queue_depth == 2)
    compute.gate.set()
    await first
    assert len((await small)[0]) == 1 and len((await big)[0]) == 5
    assert compute.batches[1] == (["a", "b"], 5)
    batcher.close()


async def test_full_queue_rejects_new_work_but_still_answers_repeats() -> None:
    compute = GatedCompute(hold_first=True)
    batcher = Batcher(compute, max_batch_size=1, max_queue=2, retry_after=3)
    running = asyncio.ensure_future(batcher.retrieve(["r"], 1))
    await _until(compute.entered.is_set)
    queued = [asyncio.ensure_future(batcher.retrieve([q], 1)) for q in ("a", "b")]
    await _until(lambda: batcher.queue_depth == 2)
    with pytest.raises(Overloaded) as info:
        await batcher.retrieve(["c"], 1)
    assert info.value.retry_after == 3 and "queue is full" in str(info.value)
    # A batch request is admitted whole or not at all.
    with pytest.raises(Overloaded):
        await batcher.retrieve(["a", "d"], 1)
    assert batcher.queue_depth == 2
    # A query already queued joins it rather than needing a slot.
    joined = asyncio.ensure_future(batcher.retrieve(["a"], 1))
    compute.gate.set()
    await asyncio.gather(running, *queued, joined)
    assert batcher.stats.rejected == 3
    batcher.close()


async def test_failed_batch_fails_its_waiters_and_is_not_cached() -> None:
    calls = []

    def flaky(queries: list[str], top_k: int) -> list[list[dict]]:
        calls.append(queries)
        if len(calls) == 1:
            raise RuntimeError("index exploded")
        return [[{"id": q, "title": "", "contents": q, "score": 1.0}] for q in queries]

    batcher = Batcher(flaky)
    with pytest.raises(RuntimeError, match="index exploded"):
        await batcher.retrieve(["x"], 1)
    assert (await batcher.retrieve(["x"], 1))[0][0]["id"] == "x"
    assert batcher.stats.failed_batches == 1 and len(calls) == 2
    batcher.close()


async def test_cache_is_bounded_by_passages_held() -> None:
    batcher = Batcher(GatedCompute(), cache_passages=6)
    for q in ("a", "b", "c", "d"):
        await batcher.retrieve([q], 2)
    assert batcher.cache_entries == 3
    await batcher.retrieve(["a"], 2)  # evicted, so computed again
    assert batcher.stats.cache_hits == 0
    batcher.close()


async def test_a_caller_giving_up_leaves_the_shared_answer_to_the_others() -> None:
    compute = GatedCompute(hold_first=True)
    batcher = Batcher(compute)
    quitter = asyncio.ensure_future(batcher.retrieve(["shared"], 1))
    await _until(compute.entered.is_set)
    stayers = [asyncio.ensure_future(batcher.retrieve(["shared"], 1)) for _ in range(3)]
    await asyncio.sleep(0)
    quitter.cancel()
    compute.gate.set()
    answers = await asyncio.gather(*stayers)
    assert quitter.cancelled()
    assert [a[0][0]["id"] for a in answers] == ["shared#0"] * 3
    assert len(compute.batches) == 1 and batcher.cache_entries == 1
    batcher.close()


async def test_second_worker_starts_a_batch_beside_a_running_one_only_when_enough_queries_wait() -> None:
    compute = GatedCompute(hold_first=True)
    batcher = Batcher(compute, workers=2, parallel_min_batch=3)
    first = asyncio.ensure_future(batcher.retrieve(["q0"], 1))
    await _until(compute.entered.is_set)
    few = [asyncio.ensure_future(batcher.retrieve([q], 1)) for q in ("q1", "q2")]
    await _until(lambda: batcher.queue_depth == 2)
    await asyncio.sleep(0.05)
    assert len(compute.batches) == 1  # two waiting: they wait for the running batch rather than start their own
    third = asyncio.ensure_future(batcher.retrieve(["q3"], 1))
    await _until(lambda: len(compute.batches) == 2)  # three waiting: the second worker takes them at once
    assert compute.batches[1] == (["q1", "q2", "q3"], 1) and batcher.queue_depth == 0
    assert batcher.computing == 4
    compute.gate.set()
    await asyncio.gather(first, *few, third)
    assert batcher.stats.batches == 2 and batcher.computing == 0
    await batcher.drain(1)
    batcher.close()


async def test_lone_queries_run_on_the_first_worker_even_after_both_worked() -> None:
    threads: list[str] = []

    def compute(queries: list[str], top_k: int) -> list[list[dict]]:
        threads.append(threading.current_thread().name)
        time.sleep(0.02)
        return [[{"id": q, "title": "", "contents": q, "score": 1.0}] for q in queries]

    batcher = Batcher(compute, workers=2, parallel_min_batch=1)
    await asyncio.gather(*(batcher.retrieve([f"p{i}"], 1) for i in range(6)))
    assert len(set(threads)) == 2  # both workers ran
    threads.clear()
    for i in range(6):  # one at a time: always the same worker, one OpenMP team
        await batcher.retrieve([f"lone{i}"], 1)
    assert threads == ["rag-compute-0_0"] * 6
    batcher.close()


async def test_drain_waits_for_the_running_and_the_queued_batches_within_its_timeout() -> None:
    compute = GatedCompute(hold_first=True)
    batcher = Batcher(compute, max_batch_size=2)
    calls = [asyncio.ensure_future(batcher.retrieve([f"q{i}"], 1)) for i in range(5)]
    await _until(compute.entered.is_set)
    start = time.monotonic()
    await batcher.drain(0.2)  # held: it gives up after its timeout, with the work still there
    assert 0.15 < time.monotonic() - start < 2 and batcher.queue_depth == 4
    compute.gate.set()
    await batcher.drain(5)  # the batch running, then the two that were queued behind it
    assert all(c.done() for c in calls) and batcher.queue_depth == 0 and batcher.computing == 0
    assert [b[0] for b in compute.batches] == [["q0"], ["q1", "q2"], ["q3", "q4"]]
    batcher.close()
