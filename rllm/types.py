"""Core records of a rollout: one model call, one agent's trajectory, one task's episode.

Everything here is a pydantic model so that an episode written as JSON reads back equal to the
original (``Episode.model_validate_json(ep.model_dump_json()) == ep``); JSONL files of episodes
are the interchange format between rollouts, evaluation and training.
"""

from __future__ import annotations

import enum
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rllm.tokens.trace import TokenTrace


class TerminationReason(str, enum.Enum):
    """Why an episode stopped.

    ``ENGINE_ERROR`` (a generation the server aborted included), ``TOOL_BACKEND_ERROR`` and
    ``TIMEOUT`` are infrastructure failures: training masks them and evaluation reports them apart
    from wrong answers. ``CANCELLED`` is not infrastructure (not retried) but is not an outcome of the
    policy either: never scored, never trained. ``ERROR`` is an unexpected exception (a bug or a
    misconfiguration): never masked (training raises it), and never scored as the policy's mistake
    (evaluation counts it apart and stops once the same error repeats).
    """

    FINISHED = "finished"
    MAX_TURNS = "max_turns"
    MAX_TOKENS = "max_tokens"
    CONTEXT_OVERFLOW = "context_overflow"
    TOOL_BUDGET = "tool_budget"
    PARSE_ERROR = "parse_error"
    TIMEOUT = "timeout"
    ENGINE_ERROR = "engine_error"
    TOOL_BACKEND_ERROR = "tool_backend_error"
    CANCELLED = "cancelled"
    ERROR = "error"

    @property
    def is_infrastructure_failure(self) -> bool:
        """True when the policy is not to blame, so the episode must not be scored."""
        return self in (TerminationReason.ENGINE_ERROR, TerminationReason.TOOL_BACKEND_ERROR, TerminationReason.TIMEOUT)

    @property
    def is_scored(self) -> bool:
        """True when the episode is the policy's outcome (scored, trained on): no infrastructure, cancel or error."""
        return not self.is_infrastructure_failure and self not in (TerminationReason.CANCELLED, TerminationReason.ERROR)


class _Record(BaseModel):
    """Base for records: unknown fields are rejected so typos fail loudly."""

    model_config = ConfigDict(extra="forbid")


class ToolCall(_Record):
    """A tool call as the model produced it.

    ``arguments`` is the raw string the model wrote; ``input`` is its parsed JSON object, or
    ``None`` when the string is not a JSON object, in which case ``error`` says why.
    """

    id: str
    name: str
    arguments: str
    input: dict[str, Any] | None = None
    error: str | None = None

    @classmethod
    def from_arguments(cls, id: str, name: str, arguments: str | None) -> ToolCall:
        """Parse the raw argument string strictly: no repair, an empty string means ``{}``."""
        raw = arguments or ""
        if not raw.strip():
            return cls(id=id, name=name, arguments=raw, input={})
        try:
            parsed = json.loads(raw)
        except ValueError as error:
            return cls(id=id, name=name, arguments=raw, error=f"arguments are not valid JSON ({error})")
        if not isinstance(parsed, dict):
            return cls(id=id, name=name, arguments=raw, error="arguments must be a JSON object")
        return cls(id=id, name=name, arguments=raw, input=parsed)


class ModelOutput(_Record):
    """What one model call returned, with token ids and logprobs when the engine gives them."""

    text: str = ""
    reasoning: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    logprobs: list[float] | None = None
    finish_reason: str | None = None
    usage: dict[str, int] = Field(default_factory=dict)


class Step(_Record):
    """One model call inside an agent run.

    ``messages`` are the exact OpenAI-format chat messages sent on this call and ``tools`` the
    tool schemas offered; ``observation`` holds the ``tool`` messages that answered this call's
    tool calls (empty for a final answer); ``tool_errors`` lists calls that were refused before
    running (unknown tool, invalid JSON, missing arguments) with the error the model was shown.
    """

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = Field(default_factory=list)
    model_output: ModelOutput
    stop_reason: str | None = None
    observation: list[dict[str, Any]] = Field(default_factory=list)
    tool_errors: list[dict[str, str]] = Field(default_factory=list)
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = Field(default_factory=dict)

    @property
    def tool_calls(self) -> list[ToolCall]:
        """The tool calls the model made on this step."""
        return self.model_output.tool_calls


class Trajectory(_Record):
    """The steps of one agent within an episode.

    ``token_trace`` is the rollout's exact token sequence when a token-in/token-out engine ran it.
    """

    name: str = "agent"
    task: Any = None
    steps: list[Step] = Field(default_factory=list)
    token_trace: TokenTrace | None = None
    reward: float = 0.0
    info: dict[str, Any] = Field(default_factory=dict)

    @property
    def num_tool_errors(self) -> int:
        """How many tool calls were refused as malformed across the trajectory."""
        return sum(len(step.tool_errors) for step in self.steps)


class Episode(_Record):
    """Everything one rollout of one task produced, finished or not."""

    id: str
    task: Any = None
    trajectories: list[Trajectory] = Field(default_factory=list)
    reward: float = 0.0
    is_correct: bool = False
    termination_reason: TerminationReason = TerminationReason.FINISHED
    metrics: dict[str, float] = Field(default_factory=dict)
    info: dict[str, Any] = Field(default_factory=dict)
