"""Aborting a model call in flight when Strands' ``cancel_signal`` is set.

Strands (>= 1.62) hands ``Model.stream`` the agent's cancellation event (``agent.cancel()``, or a
``cancel_signal`` passed into the invocation) so a provider can abort its request; on its own, the
SDK only notices the event between stream chunks, after the engine has answered. A model call
that runs through ``unless_cancelled`` is cancelled as soon as the event is set, and cancelling
the engine call is what aborts the request on every engine: the HTTP engines close the connection
(vLLM and SGLang abort a request whose client went away), ``TransformersEngine`` drops the row
from its batch (freeing its slot and KV cache), and a token engine's trace gains no sampled
segment for it. ``VerlEngine`` cannot abort one request (``abort_unsupported``): there only the
wait stops, and ``StrandsAgent.cancel`` refuses.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from rllm.types import ModelOutput

T = TypeVar("T")

CANCELLED = "cancelled"
"""The finish reason of a model call that was cancelled before it finished."""

_POLL_SECONDS = 0.05
"""How often the event is checked (as Strands' own providers do: a ``threading.Event`` cannot be awaited)."""


def cancelled_output() -> ModelOutput:
    """What a cancelled model call produced: nothing, with finish reason ``cancelled``."""
    return ModelOutput(finish_reason=CANCELLED)


async def _set(event: threading.Event) -> None:
    while not event.is_set():
        await asyncio.sleep(_POLL_SECONDS)


async def unless_cancelled(call: Coroutine[Any, Any, T], cancel_signal: threading.Event | None) -> T | None:
    """``await call``; ``None`` when ``cancel_signal`` is set first, once ``call`` is cancelled and has unwound.

    A call that finishes (or fails) before the event is seen returns (or raises) as usual.
    """
    if cancel_signal is None:
        return await call
    if cancel_signal.is_set():
        call.close()
        return None
    task = asyncio.ensure_future(call)
    watcher = asyncio.ensure_future(_set(cancel_signal))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # whoever awaits us was cancelled: the request goes with it
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        await asyncio.wait({task})  # let the engine unwind: connection closed, batch row dropped
    if task.cancelled():
        return None
    return task.result()
