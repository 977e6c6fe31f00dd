"""``VerlEngine``: token-in/token-out over verl's rollout server client, inside a verl agent loop.

verl (the version ``rllm.training.verl.verl_internals.VERL_VERSION`` pins) serves the policy through
``LLMServerClient.generate(request_id, prompt_ids=..., sampling_params=...) -> TokenOutput``; this
engine renders the conversation incrementally like every other ``TokenEngine`` and sends the
rollout's exact token ids. Every turn of one rollout carries the same ``request_id``, so verl routes
it to the same replica and its prefix cache is reused. The engine also enforces the trainer's
response budget: verl does not truncate, so everything after the first prompt (sampled and tool
tokens) must fit ``response_length``. The loop builds one engine per rollout, and the budget is the
rollout's: it counts the response of every sample of every session the engine served (a history a
conversation manager rewrote, a team's nodes), so a rollout split into samples gets no more tokens
than an unsplit one. A later sample whose rewritten history is still longer than ``prompt_length``
is that rollout's context overflow (``ContextLengthExceededError``: the conversation manager may
reduce further, else the rollout ends ``context_overflow``); only a first prompt that long is a
configuration error (``PromptTooLongError``). The engine sees sessions, not agents: in a team the
first prompt of a node run that starts from a hand-off is refused the same way, and the team runner,
which knows which nodes start from the task, reads it as that rollout's overflow
(``rllm.integrations.strands.teams``).

A generation verl reports ``aborted`` (a weight sync, a replica leaving) ends the call with
``GenerationAbortedError``, like any token engine's ``abort``. verl cannot abort one request:
``LLMServerClient`` has no such method, sends every turn under a fresh request id of its own, and
its servers offer only ``abort_all_requests``. So ``agent.cancel()`` on an agent over this engine
raises ``AbortUnsupportedError`` at the call (``abort_unsupported``), and a rollout timeout (or a
``cancel_signal`` handed to the invocation) only stops waiting: the generation runs to its end on
the server and its tokens are dropped.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from rllm.engine.rollout.token_engine import TokenEngine, TokenOutput, TokenSession
from rllm.errors import (
    ContextLengthExceededError,
    EngineUnavailableError,
    PromptTooLongError,
    ResponseBudgetExhaustedError,
)

logger = logging.getLogger(__name__)

__all__ = ["VerlEngine", "VerlSession"]

# Sampling keys forwarded to verl's server (vLLM ``SamplingParams`` / SGLang names); the rest of
# rllm's sampling vocabulary (tool_choice, chat_template_kwargs, ...) has no meaning there.
_PASS_THROUGH = ("temperature", "top_p", "top_k", "min_p", "seed", "stop", "presence_penalty",
                 "frequency_penalty", "repetition_penalty", "logprobs")


@dataclass
class VerlSession(TokenSession):
    """A rollout's token state plus what verl reports about its generations.

    Attributes:
        num_preempted: Preemptions the server reported (-1 when it reports none).
        min_global_steps: Policy version of the first generation (for verl's staleness checks).
        max_global_steps: Policy version of the latest generation.
    """

    num_preempted: int = -1
    min_global_steps: int | None = None
    max_global_steps: int | None = None

    def __deepcopy__(self, memo: dict[int, Any]) -> VerlSession:
        return self

    def __copy__(self) -> VerlSession:
        return self


class VerlEngine(TokenEngine):
    """A ``TokenEngine`` whose backend is verl's ``LLMServerClient`` (or anything with its ``generate``).

    It cannot abort one request in flight (``abort_unsupported`` says why), so an agent over it
    refuses ``agent.cancel()``.

    Args:
        server_manager: verl's server client, as handed to an ``AgentLoopBase``.
        tokenizer: The policy's tokenizer.
        response_length: Tokens allowed after the first prompt (verl's ``rollout.response_length``),
            over all the samples of all the sessions this engine serves (the rollout's); each
            generation asks for at most what is left, and a rollout with nothing left ends with
            ``ResponseBudgetExhaustedError``. ``None``: no budget.
        prompt_length: Longest prompt of a sample (verl's ``rollout.prompt_length``): a longer first
            prompt of a session raises ``PromptTooLongError`` (a team's hand-off: the team runner's
            overflow), a longer rewritten history ``ContextLengthExceededError``. ``None``: no limit.
        server_sampling: Sampling parameters verl chose for this rollout (temperature, top_p,
            top_k, repetition_penalty, logprobs); sent on every turn, under any per-call ones.
        **kwargs: As for ``TokenEngine`` (tool_parser, context_length, chat_template_kwargs, ...).
    """

    abort_unsupported = (
        "verl 0.9.1's LLMServerClient cannot abort one request (it has no per-request abort, it sends every turn "
        "under a fresh request id of its own, and its servers offer only abort_all_requests), so the generation "
        "would run on unseen"
    )

    def __init__(
        self,
        server_manager: Any,
        tokenizer: Any,
        *,
        response_length: int | None = None,
        prompt_length: int | None = None,
        server_sampling: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(tokenizer, **kwargs)
        self.server_manager = server_manager
        self.response_length = response_length
        self.prompt_length = prompt_length
        self.server_sampling = dict(server_sampling or {})
        stop_ids = {self.renderer.probe.end_of_turn_id}
        if tokenizer.eos_token_id is not None:
            stop_ids.add(int(tokenizer.eos_token_id))
        self._stop_ids = frozenset(stop_ids)
        self._served: list[TokenSession] = []

    @property
    def trainer_sampling(self) -> dict[str, Any]:
        """The sampling verl's trainer fixed for this rollout: ``RLLMModel`` sends none of its own over this engine."""
        return self.server_sampling

    @property
    def wants_logprobs(self) -> bool:
        """Whether the server is asked for logprobs (verl's ``rollout.calculate_log_probs``)."""
        return bool(self.server_sampling.get("logprobs", True))

    def new_session(self) -> VerlSession:
        """State for a new rollout (the agent running it keeps it: ``StrandsAgent.token_session``)."""
        session = VerlSession()
        session.trace.require_logprobs = self.wants_logprobs
        return session

    def response_tokens(self) -> int:
        """Response tokens (sampled and tool) after each sample's prompt, over every session this engine served."""
        return sum(len(trace) - trace.prompt_length for session in self._served for trace in session.samples)

    def _budget(self, prompt_ids: list[int], max_new_tokens: int, session: TokenSession) -> int:
        if not any(served is session for served in self._served):
            self._served.append(session)
        first_prompt = session.trace.prompt_length
        if self.prompt_length is not None and first_prompt > self.prompt_length:
            sample = len(session.samples)
            if sample > 1:  # verl stores each sample as a row whose prompt must fit: this rollout overflows
                raise ContextLengthExceededError(
                    f"sample {sample} of the rollout starts with a history the conversation manager rewrote: its "
                    f"prompt has {first_prompt} tokens but rollout.prompt_length is {self.prompt_length}; the "
                    "rollout's context overflows (a conversation manager may trim further)")
            raise PromptTooLongError(
                f"the first prompt has {first_prompt} tokens but rollout.prompt_length is {self.prompt_length}: "
                "raise data.max_prompt_length or shorten the system prompt, tools or question"
            )
        if self.response_length is None:
            return max_new_tokens
        used = self.response_tokens()
        left = self.response_length - used
        if left <= 0:
            raise ResponseBudgetExhaustedError(
                f"the rollout's response already has {used} tokens (over {len(self._served)} session(s), "
                f"{sum(len(s.samples) for s in self._served)} sample(s)) of the {self.response_length} that "
                "rollout.response_length allows"
            )
        return min(max_new_tokens, left)

    async def _generate(self, prompt_ids: list[int], max_new_tokens: int, sampling: dict[str, Any],
                        session: TokenSession) -> TokenOutput:
        max_new = self._budget(prompt_ids, max_new_tokens, session)
        params = {**self.server_sampling, **{k: v for k, v in sampling.items() if k in _PASS_THROUGH}}
        params["max_tokens"] = max_new
        try:
            output = await self.server_manager.generate(
                request_id=session.request_id, prompt_ids=prompt_ids, sampling_params=params
            )
        except asyncio.CancelledError:  # a timeout or a cancel_signal: verl cannot abort the request, it runs on
            logger.debug("stopped waiting for verl request %s; the server finishes it and its tokens are dropped",
                         session.request_id)
            raise
        except Exception as error:  # the rollout server (a Ray actor) failed: infrastructure
            raise EngineUnavailableError(
                f"verl rollout server failed for request {session.request_id}: {type(error).__name__}: {error}",
                cause=repr(error),
            ) from error
        if isinstance(session, VerlSession):
            self._record(session, output)
        ids = [int(i) for i in output.token_ids]
        if output.stop_reason == "aborted":  # the base raises GenerationAbortedError; nothing of it is kept
            return TokenOutput(token_ids=ids, logprobs=None, finish_reason="abort")
        logprobs = None if output.log_probs is None else [float(lp) for lp in output.log_probs]
        if logprobs is not None and len(logprobs) != len(ids):
            raise ValueError(f"verl returned {len(ids)} token ids but {len(logprobs)} logprobs")
        # verl reports "completed" for both a stop and a cut; a cut is a full budget without a stop token.
        cut = len(ids) >= max_new and (not ids or ids[-1] not in self._stop_ids)
        return TokenOutput(token_ids=ids, logprobs=logprobs, finish_reason="length" if cut else "stop")

    @staticmethod
    def _record(session: VerlSession, output: Any) -> None:
        preempted = getattr(output, "num_preempted", None)
        if preempted is not None:
            session.num_preempted = max(session.num_preempted, 0) + int(preempted)
        fields = dict(getattr(output, "extra_fields", None) or {})
        low = fields.get("min_global_steps", fields.get("global_steps"))
        high = fields.get("max_global_steps", fields.get("global_steps"))
        if low is not None and session.min_global_steps is None:
            session.min_global_steps = int(low)
        if high is not None:
            session.max_global_steps = int(high)
