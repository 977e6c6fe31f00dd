"""A stock Strands agent on its own traced client finishes into the same ``FinishedRollout`` as ``run_rollout``'s.

Every rollout here goes through the real LiteLLM proxy (``rllm.tracing.ProxyProcess``, one per module:
about 11 s to start) in front of a scripted vLLM-style server that serves token ids
(``ToyChatTokens``); the proxy's own environment is installed when missing (``$RLLM_PROXY_VENV`` or
``.cache/litellm-venv``, a few minutes the first time), as in ``tests/rllm/tracing/test_proxy.py``.
The agents are unchanged ``strands.Agent``s on Strands' ``OpenAIModel`` (streamed) or rllm's
``NonStreamingOpenAIModel``; the expected tokens are derived here from what the server was asked.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from strands import Agent, tool
from strands.agent.conversation_manager import SlidingWindowConversationManager
from strands.models.openai import OpenAIModel

from rllm.engine.rollout.openai_engine import OpenAIEngine
from rllm.errors import ConfigurationError, GenerationAbortedError, RolloutWithoutTokensError, ToolBackendError
from rllm.integrations.strands import Budget, NonStreamingOpenAIModel, record, run_traced_rollout
from rllm.integrations.strands.rollout import RolloutEnd
from rllm.offline.scripted_server import ScriptedOpenAIServer, ScriptedReply, ScriptedToolCall, ToyChatTokens
from rllm.rewards.base import RewardOutput
from rllm.tokens.renderer import content_text
from rllm.tracing import Backend, ProxyConfig, ProxyProcess, TraceStore, get_chat_client_async, install_proxy_venv
from rllm.tracing.proxy import VENV_ENV
from rllm.types import TerminationReason
from rllm.workflows import AgentWorkflowEngine, StrandsWorkflow

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

REPO = Path(__file__).resolve().parents[4]
ANSWER = "It is \\boxed{Paris}."
LAST = "the last entry"


def _policy(body: dict[str, Any]) -> ScriptedReply:
    """Look up until a tool result says it is the last entry, then answer; a question with "bad" first calls wrong.

    A question with "cut" has its answer cut by the backend (finish reason ``abort``, as vLLM and SGLang
    answer an aborted request).
    """
    messages = body["messages"]
    last = messages[-1]
    if not body.get("tools") or (last.get("role") == "tool" and LAST in content_text(last.get("content"))):
        question = next((content_text(m.get("content")) for m in messages if m.get("role") == "user"), "")
        if "cut" in question:
            return ScriptedReply(content=ANSWER[:9], finish_reason="abort")
        return ScriptedReply(content=ANSWER)
    looked = sum(1 for m in messages if m.get("role") == "tool")
    if looked == 0 and "bad" in content_text(messages[-1].get("content")):
        return ScriptedReply(content="", tool_calls=[ScriptedToolCall("lookup", "{}")])  # no key: refused
    return ScriptedReply(content="", tool_calls=[ScriptedToolCall("lookup", json.dumps({"key": f"k{looked}"}))])


def _lookup(lookups: int) -> Any:
    """A lookup tool whose ``lookups``-th call says it is the last entry (long results, for the window)."""
    calls: list[str] = []

    @tool
    def lookup(key: str) -> str:
        """Look a key up.

        Args:
            key: The key.
        """
        calls.append(key)
        padding = " ".join(f"w{i}" for i in range(40))
        return f"entry {key}: {padding}" + (f" ({LAST}: Paris)" if len(calls) >= lookups else "")

    return lookup


def _served(bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The verl fields of the samples the backend's answers make: a prompt not extending the last starts one."""
    samples: list[dict[str, Any]] = []
    tokens: list[int] = []
    mask: list[int] = []
    prompt_length = 0
    for body in bodies:
        prompt = ToyChatTokens.prompt_ids(body["messages"])
        completion = ToyChatTokens.completion_ids(_policy(body))
        if not tokens or prompt[: len(tokens)] != tokens:
            tokens, mask, prompt_length = list(prompt), [0] * len(prompt), len(prompt)
            samples.append({})
        mask += [0] * (len(prompt) - len(tokens)) + [1] * len(completion)
        tokens = prompt + completion
        samples[-1].update(prompt_ids=tokens[:prompt_length], response_ids=tokens[prompt_length:],
                           response_mask=mask[prompt_length:])
    return samples


@pytest.fixture(scope="module")
def backend() -> Iterator[ScriptedOpenAIServer]:
    with ScriptedOpenAIServer(ToyChatTokens.wrap(_policy), model="served-model") as server:
        yield server


@pytest.fixture(scope="module")
def proxy(backend: ScriptedOpenAIServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    venv = install_proxy_venv(os.environ.get(VENV_ENV) or REPO / ".cache" / "litellm-venv")
    run_dir = tmp_path_factory.mktemp("proxy")
    config = ProxyConfig([Backend(backend.base_url, "served-model"),  # "policy": vLLM-style, token ids
                          Backend(backend.base_url, "served-model", kind="openai", model_name="plain")],
                         db_path=run_dir / "traces.db")
    with ProxyProcess(config, run_dir=run_dir, venv=venv) as running:
        yield running


@pytest.fixture(scope="module")
def store(proxy: ProxyProcess) -> Iterator[TraceStore]:
    with TraceStore(proxy.config.db_path) as reader:
        yield reader


@pytest.fixture
async def client(proxy: ProxyProcess, backend: ScriptedOpenAIServer) -> AsyncIterator[openai.AsyncOpenAI]:
    backend.clear()
    traced = get_chat_client_async(proxy.base_url, proxy.api_key, max_retries=0)
    yield traced
    await traced.close()


def _agent(model: Any, lookups: int, **kwargs: Any) -> Agent:
    return Agent(model=model, tools=[_lookup(lookups)], system_prompt="Look it up; answer in \\boxed{}.",
                 callback_handler=None, **kwargs)


@pytest.mark.parametrize("model_cls", [OpenAIModel, NonStreamingOpenAIModel], ids=["streamed", "non-streamed"])
async def test_a_stock_agent_on_openai_model_finishes_with_the_exact_tokens_it_was_served(
        client: openai.AsyncOpenAI, store: TraceStore, backend: ScriptedOpenAIServer, model_cls: type) -> None:
    agent = _agent(model_cls(client=client, model_id="policy", params={"temperature": 0.7}), lookups=2)
    finished = await run_traced_rollout(agent, "What is the capital of France?", store, recorder=record(agent))

    assert finished.error is None
    assert finished.end == RolloutEnd(reason=TerminationReason.FINISHED, failure="", final_answer=ANSWER)
    (trajectory,) = finished.trajectories
    assert [[c.name for c in s.tool_calls] for s in trajectory.steps] == [["lookup"], ["lookup"], []]
    assert trajectory.steps[-1].model_output.text == ANSWER and trajectory.name == agent.name
    assert {s.info["session_id"] for s in trajectory.steps} == {trajectory.info["session_id"]}
    assert [json.loads(json.dumps(s.messages)) for s in trajectory.steps] == [b["messages"] for b in backend.requests]
    # One sample: the prompt the backend rendered first, then every completion it served (mask 1) and the
    # tool results between them (mask 0), with the served logprobs on the sampled tokens.
    served = _served(backend.requests)
    assert len(served) == 1 and sum(served[0]["response_mask"]) > 0
    (sample,) = finished.token_samples()
    assert {k: sample[k] for k in ("prompt_ids", "response_ids", "response_mask")} == served[0]
    assert sample["response_logprobs"] == [-0.1 if m else 0.0 for m in served[0]["response_mask"]]
    assert sample["num_turns"] == 6  # prompt, completion, tool result, completion, tool result, completion
    assert finished.num_model_calls == 3 and finished.sample_names == [agent.name] and not finished.truncated
    assert finished.metrics["turns"] == 3 and finished.metrics["samples"] == 1 and finished.metrics["tool_calls"] == 2
    assert finished.metrics["completion_tokens"] == sum(sample["response_mask"])  # the backend's usage


async def test_a_history_rewritten_by_a_sliding_window_comes_back_as_several_exact_samples(
        client: openai.AsyncOpenAI, store: TraceStore, backend: ScriptedOpenAIServer) -> None:
    window = SlidingWindowConversationManager(window_size=4, per_turn=True)
    agent = _agent(OpenAIModel(client=client, model_id="policy"), lookups=4, conversation_manager=window)
    finished = await run_traced_rollout(agent, "What is the capital of France?", store, recorder=record(agent))

    assert finished.end.reason is TerminationReason.FINISHED and finished.end.final_answer == ANSWER
    served = _served(backend.requests)
    assert len(backend.requests) == 5 and len(served) >= 2  # the window dropped the start of the history
    assert [{k: s[k] for k in ("prompt_ids", "response_ids", "response_mask")} for s in finished.samples] == served
    assert len(finished.trajectories) == len(served) and finished.sample_names == [agent.name] * len(served)
    for index, trajectory in enumerate(finished.trajectories):
        assert trajectory.info["sample"] == index and trajectory.token_trace is not None
        assert trajectory.steps and all(s.info["token_sequence"] == index for s in trajectory.steps)
    assert [s.info["seq"] for t in finished.trajectories for s in t.steps] == list(range(5))
    assert finished.num_model_calls == 5 and finished.metrics["samples"] == len(served)


async def test_the_recorder_still_ends_the_run_and_notes_refused_calls(
        client: openai.AsyncOpenAI, store: TraceStore, backend: ScriptedOpenAIServer) -> None:
    agent = _agent(NonStreamingOpenAIModel(client=client, model_id="policy"), lookups=5)
    recorder = record(agent, budget=Budget(max_model_turns=2))
    finished = await run_traced_rollout(agent, "bad: what is the capital of France?", store, recorder=recorder)

    assert finished.end.reason is TerminationReason.MAX_TURNS and finished.end.final_answer == ""
    (trajectory,) = finished.trajectories
    assert len(trajectory.steps) == len(backend.requests) == 2  # the budget stopped it after the second tool round
    (refused,) = trajectory.steps[0].tool_errors  # the call without its key never ran
    assert refused["name"] == "lookup" and "missing required argument(s): key" in refused["error"]
    assert trajectory.steps[1].tool_errors == [] and finished.metrics["tool_errors"] == 1
    assert [{k: s[k] for k in ("prompt_ids", "response_ids", "response_mask")} for s in finished.samples] == \
        _served(backend.requests)


async def test_a_backend_without_token_ids_evaluates_but_has_nothing_to_train_on(
        client: openai.AsyncOpenAI, store: TraceStore, backend: ScriptedOpenAIServer) -> None:
    agent = _agent(OpenAIModel(client=client, model_id="plain"), lookups=1)  # LiteLLM's openai/ provider
    finished = await run_traced_rollout(agent, "What is the capital of France?", store, recorder=record(agent))

    assert finished.end == RolloutEnd(reason=TerminationReason.FINISHED, failure="", final_answer=ANSWER)
    (trajectory,) = finished.trajectories
    assert len(trajectory.steps) == 2 and trajectory.token_trace is None  # both calls, logged after the reply
    assert trajectory.info["capture"]["calls_without_token_ids"] == 2
    assert finished.samples == [] and finished.num_model_calls == 0
    with pytest.raises(RolloutWithoutTokensError, match="none of the rollout's 2 model calls came with token ids"):
        finished.token_samples()


async def test_an_agent_whose_calls_bypass_the_proxy_is_refused_as_a_configuration_error(
        store: TraceStore, backend: ScriptedOpenAIServer) -> None:
    direct = openai.AsyncOpenAI(base_url=backend.base_url, api_key="EMPTY", max_retries=0)  # not traced
    agent = _agent(OpenAIModel(client=direct, model_id="served-model"), lookups=1)
    finished = await run_traced_rollout(agent, "What is the capital of France?", store, recorder=record(agent),
                                        wait_s=0.5)
    await direct.close()

    assert finished.end.reason is TerminationReason.ERROR and not finished.end.scored
    assert isinstance(finished.error, ConfigurationError)
    assert "none of the agent's 2 model calls reached the trace store" in finished.end.failure
    with pytest.raises(ConfigurationError, match="get_chat_client_async"):
        finished.raise_if_unexpected()


def _reward(task: dict[str, Any], answer: str) -> RewardOutput:
    return RewardOutput(reward=float("Paris" in answer), is_correct="Paris" in answer)


async def test_the_workflow_evaluates_a_traced_agent_from_its_factory(
        client: openai.AsyncOpenAI, proxy: ProxyProcess, backend: ScriptedOpenAIServer) -> None:
    def factory(model: Any, task: dict[str, Any]) -> Agent:  # the agent's own traced client, not ``model``
        return _agent(OpenAIModel(client=client, model_id="policy"), lookups=task["lookups"])

    engine = OpenAIEngine(model="policy", base_url=proxy.base_url, api_key=proxy.api_key)
    runner = AgentWorkflowEngine(
        StrandsWorkflow, {"agent_factory": factory, "trace_store": proxy.config.db_path, "reward_fn": _reward},
        engine, n_parallel_tasks=2, retry_limit=1, retry_backoff=0.0, progress=False)
    tasks = [{"id": "one", "question": "Capital of France?", "lookups": 1},
             {"id": "two", "question": "Capital of France, again?", "lookups": 2}]
    episodes = await runner.execute_tasks(tasks)

    assert [e.termination_reason for e in episodes] == [TerminationReason.FINISHED] * 2
    assert [e.reward for e in episodes] == [1.0, 1.0] and runner.stats.scored == 2
    assert [e.info["final_answer"] for e in episodes] == [ANSWER, ANSWER]
    assert [len(e.trajectories[0].steps) for e in episodes] == [2, 3]  # each rollout its own session
    assert len({e.trajectories[0].info["session_id"] for e in episodes}) == 2
    assert all(t.token_trace is not None and t.reward == 1.0 for e in episodes for t in e.trajectories)
    assert sum(e.metrics["turns"] for e in episodes) == len(backend.requests) == 5


async def test_a_traced_episode_that_ends_on_a_tool_backend_keeps_its_traced_steps_unscored(
        client: openai.AsyncOpenAI, proxy: ProxyProcess) -> None:
    @tool
    def lookup(key: str) -> str:
        """Look a key up.

        Args:
            key: The key.
        """
        raise ToolBackendError("the lookup service is down")

    def factory(model: Any, task: dict[str, Any]) -> Agent:
        return Agent(model=OpenAIModel(client=client, model_id="policy"), tools=[lookup], callback_handler=None)

    engine = OpenAIEngine(model="policy", base_url=proxy.base_url, api_key=proxy.api_key)
    runner = AgentWorkflowEngine(
        StrandsWorkflow, {"agent_factory": factory, "trace_store": proxy.config.db_path, "reward_fn": _reward},
        engine, n_parallel_tasks=1, retry_limit=0, retry_backoff=0.0, progress=False, max_infra_failure_share=None)
    [episode] = await runner.execute_tasks([{"id": "t", "question": "Capital of France?"}])

    assert episode.termination_reason is TerminationReason.TOOL_BACKEND_ERROR and episode.reward == 0.0
    assert "the lookup service is down" in episode.info["error"]
    (trajectory,) = episode.trajectories  # the record's, from the store: the one call, with its tokens
    assert len(trajectory.steps) == 1 and trajectory.token_trace is not None and trajectory.info["session_id"]
    assert "the lookup service is down" in json.dumps(trajectory.steps[0].observation)  # from the recorder


async def test_the_workflow_refuses_an_agent_on_a_model_it_does_not_record(
        proxy: ProxyProcess, backend: ScriptedOpenAIServer) -> None:
    backend.clear()
    direct = openai.AsyncOpenAI(base_url=backend.base_url, api_key="EMPTY", max_retries=0)
    engine = OpenAIEngine(model="policy", base_url=proxy.base_url, api_key=proxy.api_key)

    async def run(factory: Any, **args: Any) -> Any:
        runner = AgentWorkflowEngine(StrandsWorkflow, {"agent_factory": factory, "reward_fn": _reward, **args},
                                     engine, n_parallel_tasks=1, retry_limit=1, retry_backoff=0.0, progress=False)
        [episode] = await runner.execute_tasks([{"id": "t", "question": "Capital of France?"}])
        return episode

    untraced = await run(lambda model, task: _agent(OpenAIModel(client=direct, model_id="served-model"), 1))
    assert untraced.termination_reason is TerminationReason.ERROR and untraced.reward == 0.0
    assert "ConfigurationError" in untraced.info["error"] and "on another model (OpenAIModel)" in untraced.info["error"]
    on_given = await run(lambda model, task: _agent(model, 1), trace_store=proxy.config.db_path)
    assert on_given.termination_reason is TerminationReason.ERROR
    assert "with trace_store, agent_factory builds the agent on its own traced client" in on_given.info["error"]
    assert backend.requests == []  # neither ran
    await direct.close()
    with pytest.raises(ConfigurationError, match="trace_store is for an agent_factory"):
        StrandsWorkflow(engine, tools=[], trace_store=proxy.config.db_path, reward_fn=None)


@pytest.mark.parametrize("model_cls", [OpenAIModel, NonStreamingOpenAIModel], ids=["streamed", "non-streamed"])
async def test_a_generation_the_backend_cut_is_never_scored(
        client: openai.AsyncOpenAI, store: TraceStore, backend: ScriptedOpenAIServer, model_cls: type) -> None:
    agent = _agent(model_cls(client=client, model_id="policy"), lookups=1)
    finished = await run_traced_rollout(agent, "cut: what is the capital of France?", store, recorder=record(agent))
    assert finished.end.reason is TerminationReason.ENGINE_ERROR and not finished.end.scored
    assert isinstance(finished.error, GenerationAbortedError) and finished.end.final_answer == ""
