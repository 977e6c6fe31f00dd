"""``RLLMModel``: a Strands ``Model`` over any rllm ``RolloutEngine``."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import AsyncGenerator
from typing import Any, TypedDict, TypeVar

from pydantic import BaseModel
from strands.models.model import Model
from strands.types.content import Messages, SystemContentBlock
from strands.types.exceptions import ContextWindowOverflowException, ModelThrottledException
from strands.types.streaming import StreamEvent
from strands.types.tools import ToolChoice, ToolSpec
from typing_extensions import Unpack, override

from rllm.engine.rollout.base import RolloutEngine
from rllm.errors import ContextLengthExceededError, EngineThrottledError
from rllm.integrations.strands._cancel import cancelled_output, unless_cancelled
from rllm.integrations.strands._format import format_messages, format_tool_choice, format_tools, output_events
from rllm.integrations.strands._turns import mark_turn
from rllm.integrations.strands.hooks import MalformedCallGuard
from rllm.integrations.strands.run_state import (
    TOKEN_SESSION_KEY,
    ModelCall,
    current_run,
    record_model_call,
    record_side_call,
    record_token_session,
    rollout_model_state,
)
from rllm.tracing.policy_request import IgnoredSampling, trainer_owned

logger = logging.getLogger(__name__)

_IGNORED = IgnoredSampling("RLLMModel ignores in training the sampling its params set")
"""The trainer-owned keys of models' params seen in training: one warning a process, the policy server's words."""

T = TypeVar("T", bound=BaseModel)


class RLLMModel(Model):
    """Runs the unchanged Strands agent loop against a training-time engine.

    Messages go to the engine in OpenAI chat format with tool calls and tool results kept as
    such; ``tool_choice`` is passed through as Strands gives it, never forced. Each call leaves a
    ``ModelCall`` (the exact messages, tools and ``ModelOutput``) in the invoking agent's
    ``invocation_state``, where ``StrandsAgent`` records it as a ``Step``. The model holds no
    per-agent state, so one instance may be shared by any number of agents. A tool call the
    engine could not parse never runs, under any ``Agent``: the model registers a
    ``MalformedCallGuard`` on the invoking agent, and the model reads an error naming the problem.
    Strands' ``cancel_signal`` aborts the engine's request in flight (see ``stream``); an engine
    that cannot abort one says why in ``abort_unsupported``, and ``StrandsAgent.cancel`` refuses.

    In training the trainer samples: over an engine whose sampling a trainer fixed (its
    ``trainer_sampling`` is not ``None``: ``VerlEngine``, verl's sampling for the rollout), the keys of
    ``params`` that would change how the policy samples (``TRAINER_OWNED``: temperature, top_p, top_k, ...),
    whether a factory passed them at construction or with ``update_config``, are not sent, with one
    warning a process naming them, as the policy server ignores an own client's; ``max_tokens`` stays a
    cap, the smallest of the params' and the one the model was built with. Over any other engine
    (evaluation) the params are sent as they are.
    """

    class RLLMConfig(TypedDict, total=False):
        """Configuration of an ``RLLMModel``.

        Attributes:
            model_id: A name for logs and traces; the engine decides what is served.
            params: Sampling parameters sent on every call (temperature, max_tokens, ...).
            context_window_limit: Context size in tokens, for Strands' utilisation estimates.
        """

        model_id: str
        params: dict[str, Any] | None
        context_window_limit: int | None

    def __init__(self, rollout_engine: RolloutEngine, **config: Unpack[RLLMConfig]) -> None:
        unknown = set(config) - set(self.RLLMConfig.__annotations__)
        if unknown:
            raise TypeError(f"RLLMModel: unknown config keys {sorted(unknown)}")
        self.rollout_engine = rollout_engine
        self.config: dict[str, Any] = dict(config)
        self._guard = MalformedCallGuard()
        self._built_cap: int | None = (config.get("params") or {}).get("max_tokens")

    @property
    def trainer_samples(self) -> bool:
        """Whether a trainer fixed the engine's sampling (its ``trainer_sampling``): then the params' do not apply."""
        return getattr(self.rollout_engine, "trainer_sampling", None) is not None

    @property
    def abort_unsupported(self) -> str | None:
        """Why cancelling a call cannot abort the engine's request (``VerlEngine``); ``None`` when it can."""
        return getattr(self.rollout_engine, "abort_unsupported", None)

    @override
    def update_config(self, **model_config: Unpack[RLLMConfig]) -> None:  # type: ignore[override]
        """Update the configuration in place."""
        unknown = set(model_config) - set(self.RLLMConfig.__annotations__)
        if unknown:
            raise TypeError(f"RLLMModel: unknown config keys {sorted(unknown)}")
        self.config.update(model_config)

    @override
    def get_config(self) -> RLLMConfig:
        """The current configuration."""
        return self.RLLMConfig(**self.config)  # type: ignore[typeddict-item]

    @override
    async def stream(
        self,
        messages: Messages,
        tool_specs: list[ToolSpec] | None = None,
        system_prompt: str | None = None,
        *,
        tool_choice: ToolChoice | None = None,
        system_prompt_content: list[SystemContentBlock] | None = None,
        invocation_state: dict[str, Any] | None = None,
        model_state: dict[str, Any] | None = None,
        cancel_signal: threading.Event | None = None,
        **kwargs: Any,
    ) -> AsyncGenerator[StreamEvent, None]:
        """Send the conversation to the engine and replay its answer as Strands events.

        With a token engine, the rollout's ``TokenSession`` lives in the agent's own model state
        (``model_state``), so it follows the agent, not the model, and ``reset()`` clears it; the
        agent reads it as ``agent.token_session`` and its trace as ``agent.trajectory.token_trace``. A
        call without model state inside a recorded agent's run (a side call: Strands' context and
        conversation managers summarizing with the agent's model) runs in that run's session, as a
        sample of its own, and is recorded as a step of it (``step.info["side_call"]``).

        When ``cancel_signal`` (the agent's, from ``agent.cancel()`` or the invocation's) is set
        while the engine works, the request is aborted on the engine, the call is recorded with
        finish reason ``cancelled`` and nothing sampled, and no event is yielded: Strands ends the
        turn with stop reason ``cancelled``.
        """
        request_messages = format_messages(messages, system_prompt, system_prompt_content)
        tools = format_tools(tool_specs)
        sampling = self._sampling()
        choice = format_tool_choice(tool_choice)
        if choice is not None:
            sampling["tool_choice"] = choice
        session = None
        side_call = model_state is None and current_run() is not None  # e.g. a context manager's summary
        model_state = rollout_model_state(model_state, invocation_state)
        new_session = getattr(self.rollout_engine, "new_session", None)
        if new_session is not None and model_state is not None:
            session = model_state.get(TOKEN_SESSION_KEY) or model_state.setdefault(TOKEN_SESSION_KEY, new_session())
            sampling["session"] = session
            record_token_session(invocation_state, session)
        before = session.mark() if session is not None else None
        started = time.perf_counter()
        try:
            output = await unless_cancelled(
                self.rollout_engine.get_model_response(request_messages, tools or None, **sampling), cancel_signal
            )
        except EngineThrottledError as error:
            raise ModelThrottledException(str(error)) from error
        except ContextLengthExceededError as error:
            raise ContextWindowOverflowException(str(error)) from error
        if output is None:
            logger.debug("model call cancelled after %.2fs; the engine's request was aborted",
                         time.perf_counter() - started)
            record_model_call(invocation_state,
                              ModelCall(messages=request_messages, tools=tools, output=cancelled_output()))
            return
        latency_ms = int(1000 * (time.perf_counter() - started))
        turn = mark_turn(session, before) if before is not None else None
        call = ModelCall(messages=request_messages, tools=tools, output=output, turn=turn)
        if side_call:
            record_side_call(call)
        else:
            record_model_call(invocation_state, call)
        self._guard.protect(invocation_state, output.tool_calls)
        for event in output_events(output, latency_ms):
            yield event

    def _sampling(self) -> dict[str, Any]:
        """The params a call sends: as set, or in training without the trainer's keys and ``max_tokens`` a cap."""
        params = dict(self.config.get("params") or {})
        if not self.trainer_samples:
            return params
        owned = trainer_owned(params)
        if owned:
            _IGNORED.note(owned, logger)
            for key in owned:
                del params[key]
        caps = [int(cap) for cap in (self._built_cap, params.get("max_tokens")) if cap is not None]
        if caps:
            params["max_tokens"] = min(caps)
        return params

    @override
    async def structured_output(
        self, output_model: type[T], prompt: Messages, system_prompt: str | None = None, **kwargs: Any
    ) -> AsyncGenerator[dict[str, T | Any], None]:
        """Not supported: structured output would bypass the recorded agent loop."""
        raise NotImplementedError("RLLMModel does not support structured_output; ask for the answer in the prompt")
        yield  # pragma: no cover - makes this an async generator
