"""Turn a session's traces into training data: ordered ``Step``s and merged token sequences.

Each successful call becomes one ``Step`` (exact messages, tools, reply, token ids, logprobs), in
call order. Token ids are then chained: when a call's prompt ids start with the previous call's
prompt + completion ids, its new tokens (tool results, template tokens: loss mask 0) and its
completion (mask 1, with logprobs) extend the same ``TokenTrace``; otherwise (the agent edited
its history, a different template, no token ids) it starts a new sequence. ``report()`` gives
how many calls were merged and how many stand alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rllm.tokens.trace import TokenTrace
from rllm.types import ModelOutput, Step, ToolCall, Trajectory


@dataclass
class SessionTrajectory:
    """A session rebuilt from its traces.

    Attributes:
        trajectory: One step per successful call, in call order; ``token_trace`` is set when the whole
            session is one token sequence.
        token_traces: The merged token sequences, in order; ``steps[i].info["token_sequence"]`` says
            which one holds step ``i``.
        merged_calls: Calls appended to the previous call's sequence.
        separate_calls: Calls that started a sequence of their own (the first call included).
        calls_without_token_ids: Calls whose backend returned no token ids (in no sequence).
        failed_calls: Traces of calls that failed (kept in the store, not turned into steps).
    """

    trajectory: Trajectory
    token_traces: list[TokenTrace] = field(default_factory=list)
    merged_calls: int = 0
    separate_calls: int = 0
    calls_without_token_ids: int = 0
    failed_calls: int = 0

    def report(self) -> dict[str, int]:
        """The counts, for logs and metrics."""
        return {"steps": len(self.trajectory.steps), "token_sequences": len(self.token_traces),
                "merged_calls": self.merged_calls, "separate_calls": self.separate_calls,
                "calls_without_token_ids": self.calls_without_token_ids, "failed_calls": self.failed_calls}


def _model_output(response: Mapping[str, Any]) -> ModelOutput:
    message = response.get("message") or {}
    calls = [ToolCall.from_arguments((c.get("id") or f"call_{i}"), (c.get("function") or {}).get("name") or "",
                                     (c.get("function") or {}).get("arguments"))
             for i, c in enumerate(message.get("tool_calls") or [])]
    logprobs = response.get("logprobs")
    completion_ids = response.get("completion_token_ids")
    if logprobs is not None and completion_ids is not None and len(logprobs) != len(completion_ids):
        logprobs = None  # cannot be aligned with the tokens; never guess
    return ModelOutput(text=message.get("content") or "", reasoning=message.get("reasoning_content"),
                       tool_calls=calls, prompt_ids=response.get("prompt_token_ids"), completion_ids=completion_ids,
                       logprobs=logprobs, finish_reason=response.get("finish_reason"),
                       usage={k: int(v) for k, v in (response.get("usage") or {}).items()})


def _observation(step: Step, following: Step | None) -> list[dict[str, Any]]:
    """The tool messages that answered ``step``'s tool calls, read from the next call's history."""
    if following is None or not step.tool_calls:
        return []
    prefix = len(step.messages) + 1
    if len(following.messages) <= prefix or following.messages[: len(step.messages)] != step.messages:
        return []
    ids = {call.id for call in step.tool_calls}
    return [m for m in following.messages[prefix:] if m.get("role") == "tool" and m.get("tool_call_id") in ids]


def trajectory_from_traces(traces: Iterable[Mapping[str, Any]], *, name: str = "agent", task: Any = None,
                           ) -> SessionTrajectory:
    """Rebuild one session: ``traces`` as ``TraceStore.get_session`` returns them (sorted again by ``seq``)."""
    ordered = sorted(traces, key=lambda t: int(t.get("seq", 0)))
    steps: list[Step] = []
    failed = 0
    for trace in ordered:
        response = trace.get("response")
        if trace.get("error") is not None or response is None:
            failed += 1
            continue
        request = trace.get("request") or {}
        output = _model_output(response)
        steps.append(Step(messages=list(request.get("messages") or []), tools=list(request.get("tools") or []),
                          model_output=output, stop_reason=output.finish_reason,
                          info={"seq": trace.get("seq"), "trace_id": trace.get("trace_id"),
                                "session_id": trace.get("session_id"), "latency_ms": trace.get("latency_ms"),
                                "sampling": request.get("sampling") or {}, "stream": request.get("stream")}))
    for i, step in enumerate(steps):
        step.observation = _observation(step, steps[i + 1] if i + 1 < len(steps) else None)
    if steps:
        steps[-1].done = True

    result = SessionTrajectory(trajectory=Trajectory(name=name, task=task, steps=steps), failed_calls=failed)
    current: TokenTrace | None = None
    for step in steps:
        out = step.model_output
        if not out.prompt_ids or out.completion_ids is None:
            result.calls_without_token_ids += 1
            step.info["token_sequence"] = None
            current = None
            continue
        if current is not None and _extends(current, out.prompt_ids, out.logprobs is not None):
            extension = out.prompt_ids[len(current.token_ids):]
            if extension:
                current.add_context(extension)
            result.merged_calls += 1
        else:
            current = TokenTrace(require_logprobs=out.logprobs is not None)
            current.add_prompt(out.prompt_ids)
            result.token_traces.append(current)
            result.separate_calls += 1
        current.add_sampled(out.completion_ids, out.logprobs)
        step.info["token_sequence"] = len(result.token_traces) - 1
    if len(result.token_traces) == 1 and result.calls_without_token_ids == 0:
        result.trajectory.token_trace = result.token_traces[0]
    result.trajectory.info["capture"] = result.report()
    return result


def _extends(trace: TokenTrace, prompt_ids: list[int], has_logprobs: bool) -> bool:
    """True when ``prompt_ids`` continue ``trace`` exactly (and logprob availability does not change)."""
    n = len(trace.token_ids)
    if trace.require_logprobs and not has_logprobs:
        return False
    return len(prompt_ids) >= n and prompt_ids[:n] == trace.token_ids


def load_trajectory(store: Any, session_id: str, **kwargs: Any) -> SessionTrajectory:
    """``trajectory_from_traces(store.get_session(session_id))``."""
    return trajectory_from_traces(store.get_session(session_id), **kwargs)
