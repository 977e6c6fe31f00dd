"""Token-in/token-out engines: the prompt goes to the backend as token ids, the sampled ids come back.

A ``TokenEngine`` renders chat messages itself (incrementally, see ``ChatRenderer``), sends token
ids, appends the sampled ids and their logprobs to the rollout's ``TokenTrace`` and parses tool
calls out of the sampled text with a strict parser. Backends (SGLang, vLLM, local transformers,
verl) only implement ``_generate``. Per-rollout state lives in a ``TokenSession`` that the caller
keeps (``RLLMModel`` keeps one per agent), so one engine serves any number of rollouts. A call
that fails for any reason (cancelled, an engine error, a throttle) leaves the session as it found it,
the first prompt excepted: nothing it sampled reaches the trace, and the next call continues from
the last sampled turn. So a retry of the same messages (the OpenAI client's retry of a 503,
Strands' retry of a throttle) continues the sample it retried instead of starting a new one.

A rollout is one or more *samples*. While every call's messages are the previous call's plus the
model's answer plus what was appended (tool results, a user turn), the prompt grows by the rendered
delta and the sampled tokens stay exactly as sampled. When the history was rewritten instead (a
conversation manager's sliding window or summary, Strands' context-overflow reduction, a hook's
edit), the session starts a new sample at that call: its prompt is the template's render of the
rewritten messages, and it continues token-in/token-out from there. Every sampled token is in
exactly one sample (``TokenSession.samples``).

A generation the backend cut (finish reason ``abort``: SGLang's and vLLM's abort, verl's
``aborted``, ``TransformersEngine.abort``) is not the policy's answer: the call raises
``GenerationAbortedError`` before anything is parsed from the cut text, so no tool call in it
runs, and leaves the session as a cancelled call does (the cut tokens never reach the trace).
"""

from __future__ import annotations

import abc
import copy
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from rllm.engine.rollout.base import select_sampling_params
from rllm.errors import ContextLengthExceededError, GenerationAbortedError, ResponseBudgetExhaustedError
from rllm.parser import CallIdFactory, get_tool_parser
from rllm.tokens.renderer import ChatRenderer
from rllm.tokens.trace import TokenTrace
from rllm.types import ModelOutput

logger = logging.getLogger(__name__)


@dataclass
class TokenOutput:
    """What a backend sampled: token ids, their logprobs and why it stopped (stop, length, abort)."""

    token_ids: list[int]
    logprobs: list[float] | None
    finish_reason: str


@dataclass
class TokenSession:
    """One rollout's token state: its samples, the messages and tools the current one covers, its tool-call ids.

    ``trace`` is the current sample, the last of ``samples``; a rewritten history starts a new one.
    ``generate_seconds`` is the wall time its backend spent generating. ``calls`` counts the calls that
    extended the session (an unwound call is no call); ``rewritten_calls`` those of them whose history
    was not an append of the previous call's and so started a new sample.
    Copying returns the same object: Strands deep-copies per-agent model state around every call,
    and the session must stay one object for the whole rollout.
    """

    trace: TokenTrace = field(default_factory=TokenTrace)
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    call_ids: CallIdFactory = field(default_factory=CallIdFactory)
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    samples: list[TokenTrace] = field(default_factory=list)
    generate_seconds: float = 0.0
    calls: int = 0
    rewritten_calls: int = 0

    def __post_init__(self) -> None:
        if not self.samples:
            self.samples.append(self.trace)
        elif self.samples[-1] is not self.trace:
            raise ValueError("TokenSession: trace must be the last of samples")

    def mark(self) -> SessionMark:
        """Where the session stands now, for ``rewind``."""
        return SessionMark(len(self.samples), len(self.trace.segments), self.messages, self.tools, self.calls,
                           self.rewritten_calls)

    def rewind(self, mark: SessionMark) -> None:
        """Go back to ``mark``: undo what one call appended (a failed call's prompt, a discarded answer).

        A sample started since is removed again, and the call is not counted; a first prompt stays
        (the trace keeps its prompt).
        """
        if len(self.samples) > mark.samples:
            del self.samples[mark.samples:]
            self.trace = self.samples[-1]
        self.calls, self.rewritten_calls = mark.calls, mark.rewritten_calls
        if mark.segments:
            self.trace.truncate(mark.segments)
            self.messages, self.tools = mark.messages, mark.tools
        else:
            self.trace.truncate(min(1, len(self.trace.segments)))

    def start_sample(self) -> TokenTrace:
        """Begin a new sample (a rewritten history): an empty trace that becomes ``trace``."""
        self.trace = TokenTrace(require_logprobs=self.trace.require_logprobs)
        self.samples.append(self.trace)
        return self.trace

    def __deepcopy__(self, memo: dict[int, Any]) -> TokenSession:
        return self

    def __copy__(self) -> TokenSession:
        return self


@dataclass(frozen=True)
class SessionMark:
    """Where a session stood before a call: what ``TokenSession.rewind`` restores."""

    samples: int
    segments: int
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    calls: int
    rewritten_calls: int


class TokenEngine(abc.ABC):
    """Base of the token-in/token-out engines, behind the ``RolloutEngine`` protocol.

    Args:
        tokenizer: Hugging Face tokenizer with the policy's chat template.
        tool_parser: ``hermes`` (Qwen3), ``qwen3_coder``.
        context_length: Tokens the model can attend to; generation is clamped to what is left.
        chat_template_kwargs: Extra template variables, e.g. ``{"enable_thinking": False}``.
        audit: Re-render every prompt in full and log where it differs from the trace.
        **sampling: Default sampling parameters (temperature, top_p, max_tokens, ...).
    """

    abort_unsupported: str | None = None
    """Why cancelling a call cannot abort its request on the backend; ``None``: it can (the default)."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        tool_parser: str = "hermes",
        context_length: int = 32768,
        chat_template_kwargs: dict[str, Any] | None = None,
        audit: bool = False,
        **sampling: Any,
    ) -> None:
        defaults, dropped = select_sampling_params(sampling)
        if dropped:
            raise TypeError(f"{type(self).__name__}: unknown sampling parameters {dropped}")
        self.tokenizer = tokenizer
        self.renderer = ChatRenderer(tokenizer, chat_template_kwargs)
        self.parser = get_tool_parser(tool_parser)
        self.context_length = context_length
        self.audit = audit
        self.default_sampling = defaults
        self.audit_mismatches = 0

    def new_session(self) -> TokenSession:
        """State for a new rollout."""
        return TokenSession()

    @abc.abstractmethod
    async def _generate(
        self, prompt_ids: list[int], max_new_tokens: int, sampling: dict[str, Any], session: TokenSession
    ) -> TokenOutput:
        """Sample up to ``max_new_tokens`` after ``prompt_ids``, with one logprob per token."""

    async def get_model_response(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        session: TokenSession | None = None,
        **sampling: Any,
    ) -> ModelOutput:
        """Extend the session's trace with ``messages``, sample, and parse the answer.

        Raises ``GenerationAbortedError`` (infrastructure) when the backend cut the generation. A call
        that raises, whatever the cause, leaves the session as it found it (``TokenSession.rewind``),
        except a used-up response budget (``ResponseBudgetExhaustedError``), which ends the rollout with
        its last context kept.
        """
        session = session if session is not None else self.new_session()
        before = session.mark()
        self._extend_prompt(session, messages, tools)
        trace = session.trace
        params, _ = select_sampling_params({**self.default_sampling, **sampling})
        room = self.context_length - len(trace)
        if room <= 0:
            session.rewind(before)  # nothing was sampled: the caller may reduce the history and retry
            raise ContextLengthExceededError(
                f"prompt of {len(trace)} tokens fills the {self.context_length}-token context"
            )
        max_new = min(int(params.pop("max_tokens", params.pop("max_completion_tokens", room))), room)
        params.pop("tool_choice", None)
        prompt_ids = list(trace.token_ids)
        started = time.perf_counter()
        try:
            output = await self._generate(prompt_ids, max_new, params, session)
        except ResponseBudgetExhaustedError:  # the rollout's end, not a failure to retry: the context it extended
            if len(session.samples) > before.samples:  # stays, so it reads as filling its response (the truncation
                session.rewind(before)  # guard counts it); a sample it started, with nothing sampled, goes
            raise
        except BaseException:  # cancelled, or any engine error: a retry continues from where this call started
            session.rewind(before)
            raise
        finally:
            session.generate_seconds += time.perf_counter() - started
        if output.finish_reason == "abort":
            session.rewind(before)
            raise GenerationAbortedError(
                f"{type(self).__name__}: the backend aborted the generation of rollout {session.request_id} after "
                f"{len(output.token_ids)} tokens; the cut text is not parsed, run or trained",
                cause="abort",
            )
        trace.add_sampled(output.token_ids, output.logprobs)
        text = self.tokenizer.decode(output.token_ids, skip_special_tokens=False)
        parsed = self.parser.parse(text, think_prefilled=self.renderer.probe.think_prefilled, ids=session.call_ids,
                                   tools=tools)
        finish = output.finish_reason
        if finish == "stop" and parsed.tool_calls:
            finish = "tool_calls"
        return ModelOutput(
            text=parsed.content,
            reasoning=parsed.reasoning,
            tool_calls=parsed.tool_calls,
            prompt_ids=prompt_ids,
            completion_ids=list(output.token_ids),
            logprobs=output.logprobs,
            finish_reason=finish,
            usage={"prompt_tokens": len(prompt_ids), "completion_tokens": len(output.token_ids),
                   "total_tokens": len(prompt_ids) + len(output.token_ids)},
        )

    def _extend_prompt(
        self, session: TokenSession, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> None:
        trace = session.trace
        previous = session.messages
        appended = (
            len(messages) >= len(previous) + 2
            and messages[: len(previous)] == previous
            and messages[len(previous)].get("role") == "assistant"
        )
        if trace.num_turns and not appended:
            logger.debug("rollout %s: the history was rewritten (%d messages, then %d): sample %d starts here",
                         session.request_id, len(previous), len(messages), len(session.samples))
            trace = session.start_sample()
            session.rewritten_calls += 1
        session.calls += 1
        if not trace.num_turns:  # a new sample, or nothing sampled yet (a first call cancelled): render it all
            trace.truncate(0)
            trace.add_prompt(self.renderer.prompt_ids(messages, tools))
        else:
            new_messages = messages[len(previous) + 1 :]
            ends_turn = bool(trace.token_ids) and trace.token_ids[-1] == self.renderer.probe.end_of_turn_id
            trace.add_context(self.renderer.delta_ids(messages[len(previous)], new_messages, tools,
                                                      after_end_of_turn=ends_turn))
        session.messages = copy.deepcopy(messages)
        session.tools = tools
        if self.audit:
            self._audit(trace, messages, tools)

    def _audit(self, trace: TokenTrace, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> None:
        full = self.renderer.prompt_ids(messages, tools)
        if full != trace.token_ids:
            first = next(
                (i for i, (a, b) in enumerate(zip(full, trace.token_ids, strict=False)) if a != b),
                min(len(full), len(trace)),
            )
            self.audit_mismatches += 1
            logger.warning(
                "audit: a full re-render differs from the token trace at token %d of %d (re-render has %d tokens)",
                first, len(trace), len(full),
            )
