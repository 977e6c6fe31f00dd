"""The errors rllm raises, in one place, typed by who is to blame.

The kinds that matter to whoever runs rollouts:

* ``InfrastructureError``: something the policy did not cause failed (the engine is unreachable or
  throttled, a tool's own backend is down). Such a rollout is retried, masked in training and
  reported apart from wrong answers, never scored as the policy's mistake.
* ``ConfigurationError``: the run is set up wrongly (a tool backend rejects its credentials).
  Never masked: every rollout would fail the same way, so it must stop the run.
* ``ToolAccessDeniedError``: a tool refused what the policy asked for (a path outside its work
  dir, a private address). The policy's doing: the model reads the error and carries on.
* Anything else that ends a rollout unexpectedly is a bug. ``AgentWorkflowEngine`` keeps its
  episode and stops with ``SystemicFailureError`` once the same error has ended several rollouts;
  it stops with ``InfrastructureFailureRateError`` when too many rollouts fail on infrastructure.
"""

from __future__ import annotations


class RLLMError(Exception):
    """Base of every error rllm defines."""


class InfrastructureError(RLLMError):
    """Marker base: a failure of infrastructure, not of the policy (retry, mask, report apart)."""


class ConfigurationError(RLLMError):
    """The run is misconfigured (credentials, endpoints, options); it must stop, never be masked."""


class SetupError(ConfigurationError):
    """A problem the user must fix before a run starts (no model, no retrieval server); shown as a message."""


class PromptTooLongError(ConfigurationError, ValueError):
    """A rollout's first prompt is longer than the trainer's ``prompt_length``: a data or config error."""


class AbortUnsupportedError(ConfigurationError):
    """``agent.cancel()`` on an agent whose engine cannot abort one request in flight (``VerlEngine``).

    Cancelling would only stop waiting: the server would go on generating, unseen. Raised at the call.
    """


class ModelUnreachableError(SetupError):
    """A hub model could not be fetched (no hub access) and is not cached; ``why`` says what failed."""

    def __init__(self, message: str, why: str) -> None:
        super().__init__(message)
        self.why = why


class EngineError(RLLMError, RuntimeError):
    """Base class: a model call failed. ``url`` names the endpoint, ``cause`` what went wrong."""

    def __init__(self, message: str, *, url: str | None = None, cause: str | None = None) -> None:
        super().__init__(message)
        self.url = url
        self.cause = cause


class EngineUnavailableError(EngineError, InfrastructureError):
    """The engine could not be reached or kept failing (5xx, timeouts, an aborted generation)."""


class EngineThrottledError(EngineUnavailableError):
    """The engine kept answering 429 after every retry."""


class GenerationAbortedError(EngineUnavailableError):
    """The server cut a generation (finish reason ``abort``): a weight sync, a replica leaving, an operator.

    What it sampled is a cut turn, not the policy's answer: nothing in it is parsed or run, and it is
    never trained. The rollout ends ``ENGINE_ERROR`` (infrastructure: dropped, retried, not scored).
    """


class ContextLengthExceededError(EngineError):
    """The prompt (plus the requested completion) does not fit the model's context window."""


class ResponseBudgetExhaustedError(ContextLengthExceededError):
    """The rollout's response (sampled plus tool tokens) already fills its budget (verl's ``response_length``).

    The policy's own doing: a rollout ended by it is a ``max_tokens`` outcome, not an error.
    """


class EngineRequestError(EngineError):
    """The engine rejected the request (a 4xx other than 429); retrying would not help."""


class ToolBackendError(InfrastructureError):
    """A tool's own backend failed (unreachable, 5xx, timed out after its retries).

    A tool raises it instead of returning error text: Strands still shows the model an error tool
    result with the message, and the rollout ends as an infrastructure failure.
    """


class ServerStartError(RLLMError):
    """A server subprocess exited before it was ready (``returncode``), or did not answer in time (``None``)."""

    def __init__(self, message: str, *, returncode: int | None = None) -> None:
        super().__init__(message)
        self.returncode = returncode


class SystemicFailureError(RLLMError):
    """The same non-infrastructure error ended ``count`` rollouts: a bug or a misconfiguration.

    Attributes:
        cause: The error, as ``"ExceptionType: message"`` of its first occurrence.
        count: How many rollouts it ended.
        episode_ids: Ids of those rollouts' episodes (all kept in the run's output).
    """

    def __init__(self, cause: str, count: int, episode_ids: list[str] | None = None) -> None:
        self.cause = cause
        self.count = count
        self.episode_ids = list(episode_ids or [])
        super().__init__(f"the same error ended {count} rollouts; stopping the run: {cause}")


class InfrastructureFailureRateError(RLLMError):
    """More than the allowed share of a batch's rollouts failed on infrastructure (circuit breaker).

    Attributes:
        cause: The most common failure, as ``"ExceptionType: message"`` or a termination reason.
        cause_count: How many rollouts it ended.
        failures: Rollouts that ended as infrastructure failures (after retries).
        total: Rollouts in the batch.
        max_share: The share that was exceeded.
    """

    def __init__(self, cause: str, *, cause_count: int, failures: int, total: int, max_share: float) -> None:
        self.cause = cause
        self.cause_count = cause_count
        self.failures = failures
        self.total = total
        self.max_share = max_share
        super().__init__(
            f"{failures} of {total} rollouts failed on infrastructure (more than {max_share:.0%}); "
            f"stopping instead of using the rest. Most common cause ({cause_count}x): {cause}"
        )

    @property
    def share(self) -> float:
        """Failed rollouts over the batch."""
        return self.failures / self.total if self.total else 0.0


class WeightSyncError(RLLMError, RuntimeError):
    """After a sync the rollout server's weights are not the actor's (tensors missing, unknown or different).

    Never masked: every rollout after it would sample from weights that are not being trained.
    """


class TrainingGuardError(RLLMError):
    """A training guard found that training stopped being real (stale served weights, no reward signal, NaN, ...).

    Attributes:
        step: The training step it was found at.
    """

    def __init__(self, message: str, *, step: int | None = None) -> None:
        super().__init__(message)
        self.step = step


class TrainingRunError(RLLMError):
    """A training run (verl's trainer in its own process) ended with a non-zero status; the message holds its cause."""


class TokenDataError(RLLMError, ValueError):
    """Base: the token data of a rollout would be wrong (never masked: it is a bug or a misconfiguration)."""


class TemplateError(TokenDataError):
    """The chat template cannot render a conversation, or cannot render it incrementally."""


class UnsupportedContentError(TemplateError):
    """A message holds content the policy cannot take (an image for a text-only model, say)."""


class TokenTraceError(TokenDataError):
    """An append would break a ``TokenTrace``'s invariants."""


# ---- tools (rllm/tools/): a sandbox that cannot run is the run's setup; a refused path or address is the policy's


class SandboxUnavailableError(ConfigurationError, RuntimeError):
    """``python_exec`` was asked for an OS sandbox that this machine cannot provide.

    Every rollout would hit it, so raised inside an agent it stops the run: install bubblewrap, or
    opt in to the guard alone.
    """


class ToolAccessDeniedError(RLLMError, PermissionError):
    """A tool refused to reach what the policy asked for: the policy's doing, shown to the model, never masked."""


class PathOutsideWorkDirError(ToolAccessDeniedError):
    """A path leads (through ``..`` or symlinks) outside the tool's work dir."""


class BlockedDestinationError(ToolAccessDeniedError):
    """A URL's host resolves to an address ``http_request`` does not reach (private, loopback, ...)."""


# ---- trace capture (rllm/tracing/): a proxy that cannot start is the run's setup; a store that cannot write is
# infrastructure


class ProxyError(ConfigurationError, RuntimeError):
    """The trace proxy cannot run: its environment is not installed, or it did not start (its log says why)."""


class StoreWriteError(InfrastructureError, RuntimeError):
    """Traces could not be written to the trace store after every retry (disk full, database locked)."""


class ToolCallFormatError(RLLMError, ValueError):
    """Base: the policy wrote a tool call that does not parse (its own doing: the model reads the error)."""


class DuplicateKeyError(ToolCallFormatError):
    """A JSON object that gives one key twice (JSON parsers would silently keep the last)."""

    def __init__(self, key: str) -> None:
        super().__init__(f"gives the JSON key {key!r} twice")
        self.key = key


class DeclaredTypeError(ToolCallFormatError):
    """Text that fits none of the JSON types its parameter declares."""


class RolloutCancelledError(RLLMError, RuntimeError):
    """A rollout was cancelled (``agent.cancel()``, a ``cancel_signal``): it has no outcome to train on or score.

    Not infrastructure and not the policy's doing; where no other rollouts can stand in (the local
    trainer), the run stops with it.
    """


class RolloutWithoutTokensError(RLLMError, RuntimeError):
    """A rollout has no token trace to train on (never masked).

    It stopped before its first model call, or its model calls came without token ids (an engine or
    a backend that returns none: an agent on its own client behind an API other than vLLM).
    """


def exception_chain(error: BaseException, *, implicit: bool = True) -> list[BaseException]:
    """``error`` and the exceptions behind it, outermost first, each once.

    Follows ``__cause__`` (``raise ... from``) and, with ``implicit``, ``__context__`` where there
    is no cause (an exception raised while another was being handled).
    """
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and not any(current is seen for seen in chain):
        chain.append(current)
        current = current.__cause__ or (current.__context__ if implicit else None)
    return chain
