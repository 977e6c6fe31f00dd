"""The HotpotQA search agent: system prompt, the retrieval tool, the user message, the workflow set-up.

The agent is a plain Strands agent with one tool, ``local_search`` (``rag.client``), bound to a
retrieval server; ``search_workflow_args`` returns everything ``AgentWorkflowEngine`` needs to run it,
``search_verl_rows`` the rows verl trains it on, ``search_row_reward`` the recipe's reward for it:

    engine = AgentWorkflowEngine(StrandsWorkflow, search_workflow_args("http://127.0.0.1:8000"), rollout_engine)
    episodes = await engine.execute_tasks(load_hotpotqa(limit=20))

``scripted_search_reply`` is an offline stand-in for the model (search the question, answer with
the top passage's title) used by the demos and tests.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from typing import Any

from rllm.data.verl_rows import AGENT_NAME, scoring_task, verl_row
from rllm.integrations.strands import Budget
from rllm.rewards.base import RewardOutput
from rllm.rewards.search_reward import RewardSearchFn, normalize_answer
from rllm.tokens.renderer import content_text

SEARCH_SYSTEM_PROMPT = (
    "You answer questions by searching a collection of Wikipedia paragraphs with the local_search tool.\n"
    "Questions often need several facts: search for each entity or clue in turn, rephrase a query when "
    "the passages do not help, and use what one search finds to form the next query.\n"
    "When you know the answer, reply with a short final answer inside \\boxed{}, for example "
    "\\boxed{Paris}, \\boxed{1987} or \\boxed{yes}. The boxed answer should be only the answer "
    "(a name, a date, a number, yes or no), not a sentence."
)

DEFAULT_RETRIEVAL_URL = "http://127.0.0.1:8000"
DEFAULT_SEARCH_BUDGET = Budget(max_model_turns=10, max_tool_calls=16)
"""Ten model calls and sixteen searches: plenty for HotpotQA's two-hop questions."""


def resolve_retrieval_url(url: str | None = None) -> str:
    """``url``, else ``$RETRIEVAL_SERVER_URL``, else ``http://127.0.0.1:8000``."""
    return url or os.environ.get("RETRIEVAL_SERVER_URL") or DEFAULT_RETRIEVAL_URL


def search_tools(retrieval_url: str, **kwargs: Any) -> list[Any]:
    """The search agent's tools: ``local_search`` bound to the retrieval server at ``retrieval_url``.

    ``kwargs`` go to ``rag.client.make_local_search_tool`` (``token``, ``max_chars``, ``timeout``,
    ``max_retries``). The URL is always given (by the recipe in training, by
    ``search_workflow_args`` in evaluation); only the token, a secret, defaults to
    ``$RETRIEVAL_TOKEN`` (which the launcher hands to each rollout worker: ``rllm.training.verl.secrets``).
    """
    from rag.client import make_local_search_tool

    kwargs.setdefault("token", os.environ.get("RETRIEVAL_TOKEN") or None)
    return [make_local_search_tool(retrieval_url, **kwargs)]


def format_question(task: dict[str, Any]) -> str:
    """The user message for a HotpotQA task: its question."""
    question = task.get("question")
    if not isinstance(question, str) or not question.strip():
        raise KeyError(f"task {task.get('id', '?')} has no question")
    return question.strip()


def search_workflow_args(
    retrieval_url: str | None = None,
    *,
    budget: Budget | None = DEFAULT_SEARCH_BUDGET,
    partial_credit: bool = False,
    system_prompt: str = SEARCH_SYSTEM_PROMPT,
    model_kwargs: dict[str, Any] | None = None,
    agent_kwargs: dict[str, Any] | None = None,
    **tool_kwargs: Any,
) -> dict[str, Any]:
    """``workflow_args`` for ``AgentWorkflowEngine(StrandsWorkflow, ...)`` running the search agent.

    Args:
        retrieval_url: The retrieval server (default: ``$RETRIEVAL_SERVER_URL`` or port 8000).
        budget: Per-episode limits on model calls and searches.
        partial_credit: Reward token F1 when the answer is not an exact match.
        system_prompt: Replaces ``SEARCH_SYSTEM_PROMPT``.
        model_kwargs: ``RLLMModel`` config, e.g. ``{"params": {"temperature": 0.7, "max_tokens": 1024}}``.
        agent_kwargs: Extra ``StrandsAgent`` arguments.
        **tool_kwargs: ``search_tools`` arguments (``token``, ``max_chars``, ``timeout``, ...).
    """
    return {
        "tools": search_tools(resolve_retrieval_url(retrieval_url), **tool_kwargs),
        "system_prompt": system_prompt,
        "reward_fn": RewardSearchFn(partial_credit=partial_credit),
        "budget": budget,
        "task_to_prompt": format_question,
        "model_kwargs": model_kwargs,
        "agent_kwargs": agent_kwargs,
    }


DATA_SOURCE = "hotpotqa"


def search_verl_rows(
    tasks: Iterable[dict[str, Any]], split: str, *, agent_name: str = AGENT_NAME
) -> list[dict[str, Any]]:
    """Verl rows for HotpotQA ``tasks`` with the search agent's system prompt and question format."""
    return [
        verl_row(index=index, split=split, system_prompt=SEARCH_SYSTEM_PROMPT, question=format_question(task),
                 data_source=DATA_SOURCE, ground_truth=str(task["answer"]), agent_name=agent_name,
                 extra_info={"id": str(task["id"]), "question": task["question"], "type": str(task.get("type") or ""),
                             "level": str(task.get("level") or "")})
        for index, task in enumerate(tasks)
    ]


def score_search_answer(task: dict[str, Any], final_answer: str, *, partial_credit: bool = False) -> dict[str, float]:
    """The numbers of one final answer: ``score`` (the reward), ``correct``, ``f1`` and ``boxed`` (an answer found)."""
    result = RewardSearchFn(partial_credit=partial_credit)(task, final_answer)
    return {
        "score": float(result.reward),
        "correct": float(result.is_correct),
        "f1": float(result.metadata.get("f1", 0.0)),
        "boxed": float(result.metadata.get("extracted") is not None),
    }


def search_row_reward(task: dict[str, Any], final_answer: str) -> RewardOutput:
    """The HotpotQA recipe's ``rllm.reward_fn``: exact match against the row's answers (F1 logged, not rewarded).

    ``task`` is a HotpotQA task or the verl row the loop hands over (``scoring_task``); the reward's
    metadata holds ``f1`` and ``boxed``, which verl logs beside ``score`` and ``correct``.
    """
    scores = score_search_answer(scoring_task(task), final_answer, partial_credit=False)
    return RewardOutput(reward=scores["score"], is_correct=scores["correct"] == 1.0,
                        metadata={"f1": scores["f1"], "boxed": scores["boxed"]})


_TITLES = re.compile(r"^\[\d+\] (.+)$", re.MULTILINE)
_YES_NO_OPENINGS = ("are ", "is ", "was ", "were ", "do ", "does ", "did ", "can ", "has ", "have ")


def _baseline_answer(question: str, passages: str) -> str:
    """Yes for a yes/no question; else the first retrieved title the question does not already name."""
    if question.strip().lower().startswith(_YES_NO_OPENINGS):
        return "yes"
    titles = [re.sub(r"\s*\(.*\)$", "", title).strip() for title in _TITLES.findall(passages)]
    asked = set(normalize_answer(question).split())
    for title in titles:
        words = normalize_answer(title).split()
        if words and sum(word in asked for word in words) / len(words) < 0.5:
            return title
    return titles[0] if titles else "unknown"


def scripted_search_reply(body: dict[str, Any]) -> Any:
    """A stand-in policy for ``ScriptedOpenAIServer``: search the question once, then answer from the titles.

    A retrieve-and-copy baseline: "yes" to a yes/no question, otherwise the title of the first
    retrieved paragraph the question does not already name. It lets the whole loop (HTTP model,
    real retrieval, reward) run without a model, and is right now and then.
    """
    from rllm.offline.scripted_server import ScriptedReply, ScriptedToolCall

    messages = body["messages"]
    question = content_text(next(m["content"] for m in messages if m["role"] == "user"), " ")
    results = [m for m in messages if m["role"] == "tool"]
    if not results:
        return ScriptedReply(
            content="Let me search for that.",
            tool_calls=[ScriptedToolCall("local_search", json.dumps({"query": question, "top_k": 3}))],
        )
    answer = _baseline_answer(question, content_text(results[-1]["content"], " "))
    return ScriptedReply(content=f"Based on the passages, the answer is \\boxed{{{answer}}}.")


def search_demonstration(question: str, answer: str, query: str | None = None) -> Any:
    r"""A teacher for ``MessageScriptedEngine``: search once, then answer ``\boxed{answer}``.

    The search is for ``query`` (default the question). Demonstrations for a warm start through the
    rollouts' own runner and renderer: a policy trained on them calls ``local_search`` and boxes an
    answer, so a short RL run on a tiny model reaches the retrieval server and the reward (give some
    demonstrations a wrong ``answer`` for a reward that varies within a group).
    """

    def script(messages: list[dict[str, Any]]) -> dict[str, Any]:
        if not any(m.get("role") == "tool" for m in messages):
            arguments = json.dumps({"query": query or question})
            call = {"id": "call_0", "type": "function", "function": {"name": "local_search", "arguments": arguments}}
            return {"content": "", "tool_calls": [call]}
        return {"content": f"\\boxed{{{answer}}}"}

    return script
