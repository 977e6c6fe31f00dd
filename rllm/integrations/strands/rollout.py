"""What evaluation and training both read from a finished Strands rollout.

``StrandsWorkflow`` (evaluation, batch rollouts) and the verl ``StrandsAgentLoop`` (training) run
the same agent; they read its final answer and its counts here, so both score the same thing.
"""

from __future__ import annotations

from rllm.types import Trajectory


def final_answer_text(trajectory: Trajectory) -> str:
    """The model's final answer: the text of the last model call, unless that call asked for tools.

    A run stopped by the budget right after a tool round has no final answer, so "" is returned
    rather than the Strands stop notice or a tool result.
    """
    if not trajectory.steps:
        return ""
    last = trajectory.steps[-1]
    if last.tool_calls:
        return ""
    return last.model_output.text


def trajectory_metrics(trajectory: Trajectory) -> dict[str, float]:
    """Turns, tool calls, refused tool calls and token counts of one trajectory."""
    steps = trajectory.steps
    return {
        "turns": float(len(steps)),
        "tool_calls": float(sum(len(step.tool_calls) for step in steps)),
        "tool_errors": float(trajectory.num_tool_errors),
        "prompt_tokens": float(sum(step.model_output.usage.get("prompt_tokens", 0) for step in steps)),
        "completion_tokens": float(sum(step.model_output.usage.get("completion_tokens", 0) for step in steps)),
    }
