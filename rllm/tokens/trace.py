"""``TokenTrace``: the exact token sequence of one rollout, with its loss mask and logprobs.

A trace is built by appending segments in order: one prompt segment, then alternating sampled
segments (the tokens the policy generated: mask 1, each with its logprob) and context segments
(tool results, new user turns and template tokens rendered between turns: mask 0). Every append
checks the invariants, so a corrupted trace fails at the append that corrupts it, not in training.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rllm.errors import TokenTraceError

SegmentKind = Literal["prompt", "sampled", "context"]

__all__ = ["Segment", "SegmentKind", "TokenTrace"]


class Segment(BaseModel):
    """A run of tokens ``[start, end)`` of one kind; ``turn`` counts model calls from 0."""

    model_config = ConfigDict(extra="forbid")

    kind: SegmentKind
    start: int
    end: int
    turn: int


class TokenTrace(BaseModel):
    """Token ids, loss mask and logprobs of one rollout, segment by segment.

    Attributes:
        token_ids: Every token of the rollout, prompt first.
        loss_mask: 1 for tokens the policy sampled, 0 for everything else.
        logprobs: The sampling logprob of each sampled token; 0.0 for unsampled tokens.
        segments: The runs that were appended, in order.
        require_logprobs: Refuse sampled tokens that come without logprobs.
    """

    model_config = ConfigDict(extra="forbid")

    token_ids: list[int] = Field(default_factory=list)
    loss_mask: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)
    segments: list[Segment] = Field(default_factory=list)
    require_logprobs: bool = True

    @property
    def prompt_length(self) -> int:
        """Length of the first prompt; everything after it is the response."""
        return self.segments[0].end if self.segments else 0

    @property
    def num_turns(self) -> int:
        """Model calls appended so far."""
        return sum(1 for s in self.segments if s.kind == "sampled")

    def __len__(self) -> int:
        return len(self.token_ids)

    def _append(self, kind: SegmentKind, ids: list[int], mask: int, logprobs: list[float]) -> None:
        if any(not isinstance(i, int) or i < 0 for i in ids):
            raise TokenTraceError(f"{kind} segment has a token id that is not a non-negative int")
        start = len(self.token_ids)
        self.token_ids.extend(ids)
        self.loss_mask.extend([mask] * len(ids))
        self.logprobs.extend(logprobs)
        self.segments.append(Segment(kind=kind, start=start, end=len(self.token_ids), turn=self.num_turns))
        self.check()

    def add_prompt(self, ids: list[int]) -> None:
        """Start the trace with the first rendered prompt."""
        if self.segments:
            raise TokenTraceError("the prompt segment must come first and only once")
        if not ids:
            raise TokenTraceError("the prompt is empty")
        self._append("prompt", list(ids), 0, [0.0] * len(ids))

    def add_sampled(self, ids: list[int], logprobs: list[float] | None) -> None:
        """Append what the policy generated, with one logprob per token."""
        if not self.segments:
            raise TokenTraceError("sampled tokens before any prompt")
        if logprobs is None:
            if self.require_logprobs and ids:
                raise TokenTraceError(f"{len(ids)} sampled tokens came without logprobs")
            logprobs = [0.0] * len(ids)
        if len(logprobs) != len(ids):
            raise TokenTraceError(f"{len(ids)} sampled tokens but {len(logprobs)} logprobs")
        self._append("sampled", list(ids), 1, [float(lp) for lp in logprobs])

    def add_context(self, ids: list[int]) -> None:
        """Append tokens the policy did not sample (tool results, user turns, template tokens)."""
        if not self.segments:
            raise TokenTraceError("context tokens before any prompt")
        self._append("context", list(ids), 0, [0.0] * len(ids))

    def truncate(self, num_segments: int) -> None:
        """Keep only the first ``num_segments`` segments: undo what a model call that sampled nothing appended."""
        if not 0 <= num_segments <= len(self.segments):
            raise TokenTraceError(f"cannot keep {num_segments} of {len(self.segments)} segments")
        end = self.segments[num_segments - 1].end if num_segments else 0
        del self.token_ids[end:], self.loss_mask[end:], self.logprobs[end:], self.segments[num_segments:]
        self.check()

    def mask_turn(self, index: int) -> None:
        """Make the sampled segment ``index`` context (mask 0, logprobs 0.0): a turn that must not train.

        For an answer the agent discarded when other tokens already follow it; the later segments'
        ``turn`` numbers are counted again, so ``num_turns`` counts only the turns that train.
        """
        if not 0 <= index < len(self.segments) or self.segments[index].kind != "sampled":
            raise TokenTraceError(f"segment {index} is not a sampled turn")
        segment = self.segments[index]
        segment.kind = "context"
        span = range(segment.start, segment.end)
        for position in span:
            self.loss_mask[position], self.logprobs[position] = 0, 0.0
        turn = 0
        for each in self.segments:
            each.turn = turn
            turn += each.kind == "sampled"
        self.check()

    def check(self) -> None:
        """Raise ``TokenTraceError`` unless lengths agree and segments tile the sequence."""
        n = len(self.token_ids)
        if not (len(self.loss_mask) == len(self.logprobs) == n):
            raise TokenTraceError(f"lengths differ: {n} ids, {len(self.loss_mask)} mask, {len(self.logprobs)} logprobs")
        position = 0
        for index, segment in enumerate(self.segments):
            if (segment.kind == "prompt") != (index == 0):
                raise TokenTraceError("exactly one prompt segment, and it comes first")
            if segment.start != position or segment.end < segment.start:
                raise TokenTraceError(f"segment {index} does not continue at token {position}")
            expected = 1 if segment.kind == "sampled" else 0
            if any(m != expected for m in self.loss_mask[segment.start : segment.end]):
                raise TokenTraceError(f"segment {index} ({segment.kind}) has mask values other than {expected}")
            position = segment.end
        if position != n:
            raise TokenTraceError(f"segments cover {position} of {n} tokens")

    def to_verl(self, max_response_length: int | None = None) -> dict[str, Any]:
        """The verl agent-loop fields (``AgentLoopOutput``'s names), the response cut at ``max_response_length``.

        ``response_logprobs`` is ``None`` for a trace that does not require logprobs (their 0.0
        placeholders are not sampling logprobs); ``num_turns`` counts the first prompt and every
        segment after it, as verl counts turns.
        """
        p = self.prompt_length
        end = None if max_response_length is None else p + max_response_length
        return {
            "prompt_ids": self.token_ids[:p],
            "response_ids": self.token_ids[p:end],
            "response_mask": self.loss_mask[p:end],
            "response_logprobs": self.logprobs[p:end] if self.require_logprobs else None,
            "num_turns": len(self.segments),
        }
