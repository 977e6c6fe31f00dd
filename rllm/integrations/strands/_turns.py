"""Where a sampled turn sits in its token session, and how an answer the agent discarded is taken back.

Strands may throw a successful answer away: a hook sets ``AfterModelCallEvent.retry`` and the model
is called again with the same messages. Its tokens are not what the agent acted on, so they must not
train as if it had. ``take_back`` removes the turn from its sample as the token engine unwinds a call
that sampled nothing, so the retry continues the same sample token-in/token-out; when other tokens
already follow it in its sample, it stays in place as context (loss mask 0) instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class TurnMark:
    """Where one sampled turn sits in its token session.

    Attributes:
        session: The rollout's ``TokenSession``.
        trace: The sample the turn was sampled in.
        start: Segments of ``trace`` before the call extended it (0 when the call started the sample).
        end: Segments of ``trace`` right after the call (the last one is the sampled turn).
        samples_before: Samples of the session before the call.
        segments_before: Segments of the session's current sample before the call.
        messages_before: The messages the session covered before the call.
        tools_before: The tools the session covered before the call.
    """

    session: Any
    trace: Any
    start: int
    end: int
    samples_before: int
    segments_before: int
    messages_before: list[dict[str, Any]]
    tools_before: list[dict[str, Any]] | None


def session_before(session: Any) -> tuple[int, int, list[dict[str, Any]], list[dict[str, Any]] | None]:
    """What ``mark_turn`` needs of a session before its call: samples, segments, messages, tools."""
    return len(session.samples), len(session.trace.segments), session.messages, session.tools


def mark_turn(session: Any, before: tuple[int, int, list[dict[str, Any]], list[dict[str, Any]] | None]) -> TurnMark:
    """The mark of the turn a call just sampled in ``session`` (``before``: ``session_before`` of the call)."""
    samples, segments, messages, tools = before
    trace = session.trace
    started = len(session.samples) > samples
    return TurnMark(session=session, trace=trace, start=0 if started else segments, end=len(trace.segments),
                    samples_before=samples, segments_before=segments, messages_before=messages, tools_before=tools)


def take_back(mark: TurnMark) -> bool:
    """Remove the marked turn from its session; ``False`` when it could only be masked (context, mask 0).

    Nothing followed it in the session: the session goes back to before the call (a sample the call
    started is removed; a first prompt stays), so the next call continues where the previous one
    ended. Nothing followed it in its sample but the session went on in another one (a side call's):
    the sample is cut back to before the call, its prompt kept. Otherwise the turn is masked in place.
    """
    session, trace = mark.session, mark.trace
    if len(trace.segments) != mark.end:
        trace.mask_turn(mark.end - 1)
        return False
    if session.trace is trace:
        if len(session.samples) > mark.samples_before:
            del session.samples[mark.samples_before:]
            session.trace = session.samples[-1]
        session.trace.truncate(max(mark.segments_before, 1))
        if mark.segments_before:
            session.messages, session.tools = mark.messages_before, mark.tools_before
        return True
    trace.truncate(max(mark.start, 1))
    return True
