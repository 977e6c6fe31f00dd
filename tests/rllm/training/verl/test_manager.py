"""Failures in verl training: only typed infrastructure failures are dropped, everything else fails the step.

``StrandsAgentLoop.run`` drops (v1: returns ``[]``) exactly the typed infrastructure failures and
raises anything else with its cause. verl 0.9.1's v1 worker would only log such an exception, so
``StrandsAgentLoopManager`` runs the batch on ``StrandsAgentLoopWorker`` (verl's own
``AgentLoopWorkerTQ`` code, with TransferQueue stubbed) and fails the step on a raising rollout or
when more than half the batch was dropped. CPU only: a scripted rollout server, a real tiny
tokenizer, real Strands tools and a real retrieval server.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
import torch

os.environ.setdefault("OTEL_SDK_DISABLED", "true")

from fixtures.verl_loop import (  # noqa: E402
    QUESTION,
    SAMPLING,
    SYSTEM,
    FakeServerManager,
    RewardHandle,
    build_loop,
    lookup_call,
    row,
    search_then_answer_with_top_title,
    turns_script,
)
from omegaconf import read_write  # noqa: E402
from tensordict import NonTensorStack, TensorDict  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

from rllm.errors import (  # noqa: E402
    ConfigurationError,
    EngineThrottledError,
    InfrastructureFailureRateError,
    SystemicFailureError,
    TemplateError,
)
from rllm.training.verl.agent_loop import RolloutOutcome  # noqa: E402

pytestmark = pytest.mark.timeout(180)


# ---------------------------------------------------------------- what raises out of run
async def test_a_template_error_raises_out_of_run() -> None:
    """Qwen3's real template, edited to number its turns (so a turn renders differently in context)."""
    from rllm.offline.chat_templates import FAMILIES
    from rllm.offline.qwen_tokenizer import build_qwen_tokenizer

    template = FAMILIES["qwen3"].template()
    loop_marker = "{%- for message in messages %}"
    numbered = template.replace(loop_marker, loop_marker + "{{- '[' ~ loop.index ~ ']' }}", 1)
    tokenizer = build_qwen_tokenizer(numbered)
    server = FakeServerManager(FAMILIES["qwen3"].tokenizer(), turns_script("\\boxed{Paris}"))
    loop, _ = build_loop(tokenizer, server)
    outcome = RolloutOutcome()
    with pytest.raises(TemplateError, match="cannot be rendered incrementally"):
        await loop.run(dict(SAMPLING), rllm_outcome=outcome, **row())
    assert outcome.error.startswith("TemplateError: chat template") and not outcome.dropped
    assert server.calls == []  # refused before any generation


async def test_a_type_error_and_an_unknown_tool_factory_raise_out_of_run(tokenizer) -> None:
    server = FakeServerManager(tokenizer, turns_script("\\boxed{Paris}"))
    loop, _ = build_loop(tokenizer, server, tool_kwargs={"no_such_option": 1})
    with pytest.raises(TypeError, match="no_such_option"):
        await loop.run(dict(SAMPLING), **row())
    loop, _ = build_loop(tokenizer, server, tool_factory="fixtures.verl_loop:no_such_factory")
    with pytest.raises(ImportError, match="no_such_factory"):
        await loop.run(dict(SAMPLING), **row())
    assert server.calls == []


async def test_a_tool_raising_a_configuration_error_raises_out_of_run_after_its_round(tokenizer) -> None:
    server = FakeServerManager(tokenizer, turns_script(lookup_call("France"), "\\boxed{Paris}"))
    loop, _ = build_loop(tokenizer, server, fail_with="auth")
    with pytest.raises(ConfigurationError, match=r"HTTP 401.*LOOKUP_KEY"):
        await loop.run(dict(SAMPLING), **row())
    assert len(server.calls) == 1  # no generation after the refused call


@pytest.fixture(scope="module")
def guarded_retrieval_server(tmp_path_factory) -> Any:
    from rag.server import ServerSettings
    from rag.testing import RetrievalServer, demo_index

    with RetrievalServer(demo_index(tmp_path_factory.getbasetemp(), 200), ServerSettings(token="s3cret")) as srv:
        yield srv


async def test_the_real_search_tool_without_the_servers_token_raises_the_401(tokenizer, guarded_retrieval_server,
                                                                              monkeypatch) -> None:
    from rag.errors import RetrievalAuthError
    from rllm.training.verl.agent_loop import _cached_tools

    _cached_tools.cache_clear()  # tools are built once per worker process, where the environment is fixed
    monkeypatch.setenv("RETRIEVAL_SERVER_URL", guarded_retrieval_server.base_url)
    monkeypatch.delenv("RETRIEVAL_TOKEN", raising=False)
    server = FakeServerManager(tokenizer, search_then_answer_with_top_title)
    loop, _ = build_loop(tokenizer, server, stand_in_tool=False)
    with pytest.raises(RetrievalAuthError, match=r"HTTP 401.*set RETRIEVAL_TOKEN"):
        await loop.run(dict(SAMPLING), **row())

    # The token in RETRIEVAL_TOKEN (what the recipe passes to the Ray workers) makes it work.
    monkeypatch.setenv("RETRIEVAL_TOKEN", "s3cret")
    _cached_tools.cache_clear()
    server = FakeServerManager(tokenizer, search_then_answer_with_top_title)
    loop, _ = build_loop(tokenizer, server, stand_in_tool=False)
    (output,) = await loop.run(dict(SAMPLING), **row())
    assert output.extra_fields["termination_reason"] == "finished" and output.extra_fields["num_tool_calls"] == 1


# ---------------------------------------------------------------- what is dropped
class Failing(FakeServerManager):
    """A rollout server whose ``generate`` fails the given way on the second call."""

    def __init__(self, tokenizer: Any, error: BaseException) -> None:
        super().__init__(tokenizer, turns_script(lookup_call("France"), "\\boxed{Paris}"))
        self.error = error

    async def generate(self, *args: Any, **kwargs: Any) -> TokenOutput:
        if len(self.calls) == 1:
            self.calls.append({})
            raise self.error
        return await super().generate(*args, **kwargs)


@pytest.mark.parametrize("error", [ConnectionRefusedError("replica 3 unreachable"),
                                   RuntimeError("HTTP 503 from the vLLM replica"),
                                   EngineThrottledError("429 after every retry")],
                         ids=["unreachable", "5xx", "throttled"])
async def test_rollout_server_failures_are_dropped(tokenizer, error: BaseException) -> None:
    loop, _ = build_loop(tokenizer, Failing(tokenizer, error))
    outcome = RolloutOutcome()
    assert await loop.run(dict(SAMPLING), rllm_outcome=outcome, **row()) == []
    assert outcome.dropped and outcome.cause.startswith("EngineUnavailableError: verl rollout server failed")
    assert str(error) in outcome.cause and not outcome.error


async def test_a_tool_backend_marking_its_failure_is_dropped(tokenizer) -> None:
    loop, _ = build_loop(tokenizer, FakeServerManager(tokenizer, turns_script(lookup_call("France"), "x")),
                         fail_with="backend")
    outcome = RolloutOutcome()
    assert await loop.run(dict(SAMPLING), rllm_outcome=outcome, **row()) == []
    assert outcome.cause.startswith("tool 'lookup' failed: ToolBackendError: ")


# ---------------------------------------------------------------- the step: worker and manager
def _batch(questions: list[str]) -> TensorDict:
    """A training batch as verl's v1 trainer hands it to the manager."""
    rows = [row(uid=f"u-{i}", index=i, raw_prompt=[{"role": "system", "content": SYSTEM},
                                                   {"role": "user", "content": q}])
            for i, q in enumerate(questions)]
    batch = TensorDict({
        "raw_prompt": NonTensorStack(*[r["raw_prompt"] for r in rows]),
        "uid": NonTensorStack(*[r["uid"] for r in rows]),
        "data_source": NonTensorStack(*[r["data_source"] for r in rows]),
        "reward_model": NonTensorStack(*[r["reward_model"] for r in rows]),
        "extra_info": NonTensorStack(*[r["extra_info"] for r in rows]),
        "agent_name": NonTensorStack(*["strands_agent"] * len(rows)),
        "index": torch.arange(len(rows)),
    }, batch_size=[len(rows)])
    tu.assign_non_tensor_data(batch, "global_steps", 3)
    return batch


class ByQuestion(FakeServerManager):
    """Answers; aborts (infrastructure) on questions with DEAD, garbles logprobs (a bug) on questions with BUG."""

    async def generate(self, request_id: str, *, prompt_ids: list[int], **kwargs: Any) -> TokenOutput:
        text = self.tokenizer.decode(prompt_ids)
        out = await super().generate(request_id, prompt_ids=prompt_ids, **kwargs)
        if "DEAD" in text:
            return out.model_copy(update={"stop_reason": "aborted"})
        if "BUG" in text:
            return out.model_copy(update={"log_probs": out.log_probs[:-1]})
        return out


@pytest.fixture
def make_worker(tokenizer, monkeypatch) -> Any:
    """``StrandsAgentLoopWorker`` (verl's AgentLoopWorkerTQ code) with TransferQueue stubbed; stores in ``stored``."""
    import verl.experimental.agent_loop.agent_loop as verl_agent_loop
    import verl.trainer.ppo.v1.agent_loop_tq as agent_loop_tq
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import load_reward_manager

    from rllm.tracing import PolicyServer
    from rllm.training.verl.manager import StrandsAgentLoopWorker

    stored: list[str] = []
    tags: dict[str, str] = {}

    async def kv_put(key, partition_id, tag):
        tags[key] = tag["status"]

    async def kv_batch_put(keys, fields, tags, partition_id):
        stored.extend(keys)

    monkeypatch.setattr(agent_loop_tq.tq, "async_kv_put", kv_put)
    monkeypatch.setattr(agent_loop_tq.tq, "async_kv_batch_put", kv_batch_put)

    def make(server: FakeServerManager) -> Any:
        loop, config = build_loop(tokenizer, server)
        entries = OmegaConf.load(config.actor_rollout_ref.rollout.agent.agent_loop_config_path)
        monkeypatch.setitem(verl_agent_loop._agent_loop_registry, "strands_agent", entries[0])
        with read_write(config):
            config.actor_rollout_ref.rollout.n = 2
        worker = StrandsAgentLoopWorker.__new__(StrandsAgentLoopWorker)
        worker.config, worker.llm_client, worker.tokenizer = config, server, tokenizer
        worker.processor, worker.mm_processor_kwargs, worker.distillation_enabled = None, {}, False
        worker.hf_model_type, worker.dataset_cls, worker.tools = "qwen3", loop.dataset_cls, []
        worker.reward_loop_worker_handles = [RewardHandle(load_reward_manager(config, tokenizer))]
        worker.background_tasks, worker._outcomes = set(), {}
        worker._policy_server = PolicyServer()  # what StrandsAgentLoopWorker.__init__ adds to verl's worker
        worker.stored, worker.tags = stored, tags
        return worker

    return make


def answer_everything(prompt: str) -> str:
    return "\\boxed{Paris}"


async def test_the_worker_waits_for_the_batch_and_reports_every_rollout(tokenizer, make_worker) -> None:
    worker = make_worker(ByQuestion(tokenizer, answer_everything))
    report = await worker.generate_sequences(_batch([QUESTION, "DEAD question", QUESTION, "BUG question"]))

    assert report.total == 8  # 4 prompts x rollout.n = 2, all settled when generate_sequences returns
    assert sum(report.dropped.values()) == 2
    assert next(iter(report.dropped)).startswith("GenerationAbortedError: VerlEngine: the backend aborted the generation")
    (error, count), = report.errors.items()
    assert count == 2 and error.startswith("ValueError: verl returned") and "logprobs" in error
    assert len(worker.stored) == 4  # the 4 good rollouts reached TransferQueue; dropped ones did not
    assert worker.tags == {"u-0": "finished", "u-1": "finished", "u-2": "finished", "u-3": "failure"}
    assert worker._outcomes == {}  # nothing kept between batches


def test_the_manager_fails_the_step_on_an_error_or_mostly_dropped_rollouts(tokenizer, make_worker,
                                                                           monkeypatch) -> None:
    import rllm.training.verl.manager as manager_module
    from rllm.training.verl.manager import StrandsAgentLoopManager

    actor_loop = asyncio.new_event_loop()  # one loop, as in a Ray async actor (verl's reward manager binds to it)
    asyncio.set_event_loop(actor_loop)

    class Handle:
        """A Ray actor handle stand-in: ``generate_sequences.remote`` runs the worker to completion."""

        def __init__(self, worker: Any) -> None:
            self.generate_sequences = self
            self.worker = worker

        def remote(self, chunk: TensorDict) -> Any:
            return actor_loop.run_until_complete(self.worker.generate_sequences(chunk))

    monkeypatch.setattr(manager_module.ray, "get", lambda refs: refs)

    def manager_for(server: FakeServerManager) -> StrandsAgentLoopManager:
        worker = make_worker(server)
        manager = StrandsAgentLoopManager(worker.config, llm_client=server)
        manager.agent_loop_workers = [Handle(worker), Handle(make_worker(server))]
        return manager

    # A healthy step, and one with a quarter dropped: trained on, the drop logged.
    manager = manager_for(ByQuestion(tokenizer, answer_everything))
    manager.generate_sequences(_batch([QUESTION, QUESTION, "DEAD question", QUESTION]))
    assert manager.last_report.total == 8 and sum(manager.last_report.dropped.values()) == 2

    # Three quarters dropped: the step stops with the most common cause.
    manager = manager_for(ByQuestion(tokenizer, answer_everything))
    with pytest.raises(InfrastructureFailureRateError, match="GenerationAbortedError: VerlEngine: the backend aborted") as info:
        manager.generate_sequences(_batch(["DEAD one", "DEAD two", "DEAD three", QUESTION]))
    assert (info.value.failures, info.value.total) == (6, 8)

    # A single raising rollout fails the step with its cause (verl's own worker would only log it).
    manager = manager_for(ByQuestion(tokenizer, answer_everything))
    with pytest.raises(SystemicFailureError, match="ValueError: verl returned .* logprobs"):
        manager.generate_sequences(_batch([QUESTION, QUESTION, QUESTION, "BUG question"]))
    asyncio.set_event_loop(None)
    actor_loop.close()


def test_the_manager_reads_its_share_and_refuses_the_async_trainers(tokenizer, make_worker) -> None:
    from rllm.training.verl.manager import StrandsAgentLoopManager

    config = make_worker(FakeServerManager(tokenizer, answer_everything)).config
    assert StrandsAgentLoopManager(config, llm_client=None).max_infra_failure_share == 0.5
    with read_write(config):
        config.rllm.max_infra_failure_share = None
    assert StrandsAgentLoopManager(config, llm_client=None).max_infra_failure_share is None
    with read_write(config):
        config.trainer.v1.trainer_mode = "separate_async"
    with pytest.raises(ConfigurationError, match="only suits the synchronous trainer .*got 'separate_async'"):
        StrandsAgentLoopManager(config, llm_client=None)
