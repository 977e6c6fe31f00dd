"""Where a sampled turn sits in its token session, and how an answer the agent discarded is taken back.

Strands may throw a successful answer away: a hook sets ``AfterModelCallEvent.retry`` and the model
is called again with the same messages. Its tokens are not what the agent acted on, so they must not
train as if it had. ``take_back`` rewinds the session to before the call (``TokenSession.rewind``, as
the token engine undoes a failed call), so the retry continues the same sample token-in/token-out;
when other tokens already follow it in its sample, it stays in place as context (loss mask 0) instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rllm.engine.rollout.token_engine import SessionMark


@dataclass
class TurnMark:
    """Where one sampled turn sits in its token session.

    Attributes:
        session: The rollout's ``TokenSession``.
        trace: The sample the turn was sampled in.
        start: Segments of ``trace`` before the call extended it (0 when the call started the sample).
        end: Segments of ``trace`` right after the call (the last one is the sampled turn).
        before: The session's ``mark()`` before the call.
    """

    session: Any
    trace: Any
    start: int
    end: int
    before: SessionMark


def mark_turn(session: Any, before: SessionMark) -> TurnMark:
    """The mark of the turn a call just sampled in ``session`` (``before``: ``session.mark()`` before the call)."""
    trace = session.trace
    started = len(session.samples) > before.samples
    return TurnMark(session=session, trace=trace, start=0 if started else before.segments,
                    end=len(trace.segments), before=before)


def take_back(mark: TurnMark) -> bool:
    """Remove the marked turn from its session; ``False`` when it could only be masked (context, mask 0).

    Nothing followed it in the session: the session goes back to before the call (``rewind``: a sample
    the call started is removed, a first prompt stays, the call is not counted), so the next call
    continues where the previous one ended. Nothing followed it in its sample but the session went on
    in another one (a side call's): the sample is cut back to before the call, its prompt kept.
    Otherwise the turn is masked in place.
    """
    session, trace = mark.session, mark.trace
    if len(trace.segments) != mark.end:
        trace.mask_turn(mark.end - 1)
        return False
    if session.trace is trace:
        session.rewind(mark.before)
        return True
    trace.truncate(max(mark.start, 1))
    return True
