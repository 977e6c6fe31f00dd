"""``StrandsAgentLoop`` inside verl 0.9.1, on CPU.

The loop is built the way verl's ``AgentLoopWorker`` builds it: the recipe composed with Hydra,
the entry of the agent-loop YAML instantiated with ``hydra.utils.instantiate`` and verl's
keyword arguments. verl's rollout server is replaced by a fake ``server_manager`` whose
``generate`` returns verl ``TokenOutput``s scripted as text through the real tiny Qwen3-style
tokenizer; tools are real Strands tools. The loop scores with the recipe's ``rllm.reward_fn`` and hands
verl the score (``reward_score``), which verl's own worker path (``AgentLoopWorker._compute_score``) keeps.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("OTEL_SDK_DISABLED", "true")

from verl.experimental.agent_loop.agent_loop import (  # noqa: E402
    AgentLoopOutput,
    AgentLoopWorker,
    DictConfigWrap,
    ToolListWrap,
)
from verl.trainer.ppo.reward import load_reward_manager  # noqa: E402
from verl.utils.dataset.rl_dataset import RLHFDataset  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

from rllm.errors import ConfigurationError, PromptTooLongError  # noqa: E402
from rllm.offline.scripted_tokens import Cut  # noqa: E402
from rllm.tracing import PolicyServer  # noqa: E402
from rllm.training.verl.agent_loop import POLICY_SERVER_KWARG, RolloutOutcome, StrandsAgentLoop  # noqa: E402

REPO = Path(__file__).resolve().parents[4]
from fixtures.verl_loop import (  # noqa: E402
    GROUND_TRUTH,
    LOOKUPS,
    SAMPLING,
    SYSTEM,
    EmbeddedServerClient,
    FakeServerManager,
    RewardHandle,
    build_loop,
    compose,
    lookup_call,
    row,
    sampled_positions,
    search_then_answer_with_top_title,
    turns_script,
)


async def test_multi_turn_output_is_exactly_what_was_sent_and_sampled(tokenizer) -> None:
    server = FakeServerManager(tokenizer, turns_script(lookup_call("France"), lookup_call("Paris"),
                                                       "The capital is \\boxed{Paris}."))
    loop, config = build_loop(tokenizer, server)
    LOOKUPS.clear()

    (output,) = await loop.run(dict(SAMPLING), **row())

    assert isinstance(output, AgentLoopOutput)
    assert LOOKUPS == ["France", "Paris"] and len(server.calls) == 3
    # One request id for the whole rollout (sticky routing, prefix cache); verl's sampling passed on.
    assert {c["request_id"] for c in server.calls} == {server.calls[0]["request_id"]}
    assert all(c["sampling_params"]["temperature"] == 1.0 and c["sampling_params"]["logprobs"] for c in server.calls)
    # Every turn extends the previous prompt with exactly what was sampled, then the tool turn.
    for previous, current in zip(server.calls, server.calls[1:]):
        sent_before = previous["prompt_ids"] + previous["token_ids"]
        assert current["prompt_ids"][: len(sent_before)] == sent_before
    last = server.calls[-1]
    assert output.prompt_ids == server.calls[0]["prompt_ids"]
    assert output.prompt_ids + output.response_ids == last["prompt_ids"] + last["token_ids"]
    # The mask is 1 exactly on sampled tokens, whose logprobs are the server's; 0.0 elsewhere.
    first = len(output.prompt_ids)
    sampled = sampled_positions(server, first)
    assert [i for i, m in enumerate(output.response_mask) if m] == sampled
    returned = [lp for c in server.calls for lp in c["log_probs"]]
    assert [output.response_logprobs[i] for i in sampled] == returned
    assert all(lp == 0.0 for i, lp in enumerate(output.response_logprobs) if i not in set(sampled))
    assert len(output.response_ids) == len(output.response_mask) == len(output.response_logprobs)
    # Each call may use only what is left of the response budget.
    for call in server.calls:
        assert call["sampling_params"]["max_tokens"] == config.actor_rollout_ref.rollout.response_length - (
            len(call["prompt_ids"]) - first)
    assert tokenizer.decode(output.prompt_ids).startswith("<|im_start|>system\n" + SYSTEM)
    assert output.num_turns == 6  # user, 3 assistant turns, 2 tool turns
    assert output.reward_score == 1.0  # scored by the loop with rllm.reward_fn, handed to verl: one path only
    extra = output.extra_fields
    assert extra["reward_extra_info"] == {"score": 1.0, "correct": 1.0, "f1": 1.0, "boxed": 1.0, "tool_calls": 2.0}
    assert extra["final_answer"] == "The capital is \\boxed{Paris}."
    assert extra["termination_reason"] == "finished" and extra["infra_failure"] is False
    assert extra["num_tool_calls"] == 2 and extra["num_model_calls"] == 3 and extra["num_tool_errors"] == 0
    assert extra["min_global_steps"] == extra["max_global_steps"] == 3
    assert output.metrics.generate_sequences > 0 and output.metrics.num_preempted == 0
    # verl's v1 worker turns it into tensors without complaint.
    fields = output.as_dict()
    assert fields["rollout_log_probs"].shape == fields["responses"].shape == fields["response_mask"].shape


async def score_through_verl(config: Any, tokenizer: Any, output: AgentLoopOutput) -> None:
    """verl's worker reward path (``AgentLoopWorker._compute_score``): it calls no reward function for a scored output."""
    worker = AgentLoopWorker.__new__(AgentLoopWorker)  # only the reward plumbing of verl's worker
    worker.processor, worker.mm_processor_kwargs = None, {}
    handle = RewardHandle(load_reward_manager(config, tokenizer))
    worker.reward_loop_worker_handles = [handle]
    await worker._compute_score([output], kwargs=row())
    assert handle.calls == 0


async def test_the_loop_hands_verl_its_score_and_reads_only_the_final_answer(tokenizer) -> None:
    # The tool output holds a boxed "Paris"; the agent's own final answer does not answer.
    server = FakeServerManager(tokenizer, turns_script(lookup_call("decoy"), "I could not find it."))
    loop, config = build_loop(tokenizer, server)
    (output,) = await loop.run(dict(SAMPLING), **row())
    assert "\\boxed{Paris}" in tokenizer.decode(output.response_ids)
    await score_through_verl(config, tokenizer, output)
    assert output.reward_score == 0.0
    assert output.extra_fields["reward_extra_info"]["boxed"] == 0.0

    server = FakeServerManager(tokenizer, turns_script(lookup_call("France"), "It is \\boxed{Paris}."))
    loop, config = build_loop(tokenizer, server)
    (output,) = await loop.run(dict(SAMPLING), **row())
    await score_through_verl(config, tokenizer, output)
    assert output.reward_score == 1.0
    info = output.extra_fields["reward_extra_info"]
    assert info["correct"] == 1.0 and info["boxed"] == 1.0 and info["tool_calls"] == 1.0


def verls_v1_worker(config: Any, tokenizer: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[dict[str, Any]]]:
    """verl's v1 agent-loop worker, only its storing and scoring path, and what it puts into TransferQueue."""
    import verl.trainer.ppo.v1.agent_loop_tq as agent_loop_tq

    stored: list[dict[str, Any]] = []

    async def kv_batch_put(keys, fields, tags, partition_id):  # TransferQueue, the v1 trainer's store
        stored.append({"keys": keys, "fields": fields, "tags": tags, "partition": partition_id})

    monkeypatch.setattr(agent_loop_tq.tq, "async_kv_batch_put", kv_batch_put)
    worker_cls = agent_loop_tq.AgentLoopWorkerTQ.__ray_actor_class__  # the class behind verl's Ray actor
    worker = worker_cls.__new__(worker_cls)
    worker.processor, worker.mm_processor_kwargs, worker.distillation_enabled = None, {}, False
    worker.reward_loop_worker_handles = [RewardHandle(load_reward_manager(config, tokenizer))]
    return worker, stored


async def test_verls_v1_worker_stores_the_trajectory_and_nothing_for_an_excluded_rollout(tokenizer,
                                                                                         monkeypatch) -> None:
    server = FakeServerManager(tokenizer, turns_script(lookup_call("France"), "\\boxed{Paris}"))
    loop, config = build_loop(tokenizer, server)
    worker, stored = verls_v1_worker(config, tokenizer, monkeypatch)

    (output,) = await loop.run(dict(SAMPLING), **row())
    await worker._agent_loop_postprocess(output, False, **row())
    (put,) = stored
    assert put["keys"] == ["u-0_0_0"] and put["partition"] == "train"
    tag = put["tags"][0]
    assert tag["status"] == "success" and tag["min_global_steps"] == tag["max_global_steps"] == 3
    assert tag["response_len"] == len(output.response_ids) and tag["prompt_len"] == len(output.prompt_ids)
    fields = put["fields"]
    assert fields["loss_mask"][0].tolist() == output.response_mask
    assert fields["rm_scores"][0].tolist()[-1] == 1.0 and sum(fields["rm_scores"][0].tolist()) == 1.0

    aborted = FakeServerManager(tokenizer, turns_script(lookup_call("France"), "\\boxed{Paris}"), abort_on_call=2)
    loop, _ = build_loop(tokenizer, aborted)
    excluded = await loop.run(dict(SAMPLING), **row(session_id=1))
    await worker._agent_loop_postprocess(excluded, False, **row(session_id=1))
    assert len(stored) == 1  # nothing stored for the aborted rollout: no tokens, no reward, not in the group


async def test_response_is_capped_at_response_length(tokenizer) -> None:
    # Long tool results fill the budget: generation asks only for what is left, then stops.
    server = FakeServerManager(tokenizer, turns_script(lookup_call("long"), lookup_call("long"), lookup_call("long"),
                                                       lookup_call("long"), "\\boxed{Paris}"))
    loop, config = build_loop(tokenizer, server, "data.max_response_length=160")
    (output,) = await loop.run(dict(SAMPLING), **row())

    cap = config.actor_rollout_ref.rollout.response_length
    assert cap == 160
    assert len(output.response_ids) == len(output.response_mask) == len(output.response_logprobs) == cap
    last = server.calls[-1]
    whole = output.prompt_ids + output.response_ids
    sent = last["prompt_ids"] + last["token_ids"]
    assert whole[: len(sent)] == sent[: len(whole)]
    sampled = [i for i in sampled_positions(server, len(output.prompt_ids)) if i < cap]
    assert [i for i, m in enumerate(output.response_mask) if m] == sampled
    for call in server.calls:
        assert 0 < call["sampling_params"]["max_tokens"] <= cap - (len(call["prompt_ids"]) - len(output.prompt_ids))
    extra = output.extra_fields
    assert extra["termination_reason"] == "max_tokens" and extra["final_answer"] == ""
    assert extra["infra_failure"] is False


async def test_generation_cut_by_the_budget_ends_with_max_tokens(tokenizer) -> None:
    server = FakeServerManager(tokenizer, turns_script("word " * 400))
    loop, _ = build_loop(tokenizer, server, "data.max_response_length=64")
    (output,) = await loop.run(dict(SAMPLING), **row())

    assert server.calls[0]["sampling_params"]["max_tokens"] == 64
    assert len(output.response_ids) == 64 and output.response_mask == [1] * 64
    assert output.extra_fields["termination_reason"] == "max_tokens" and output.extra_fields["final_answer"] == ""


async def test_aborted_generation_is_an_infrastructure_failure_excluded_from_the_update(tokenizer) -> None:
    server = FakeServerManager(tokenizer, turns_script(lookup_call("France"), "\\boxed{Paris}"), abort_on_call=2)
    loop, config = build_loop(tokenizer, server)

    # v1 (the default trainer): the session yields no trajectory at all.
    assert await loop.run(dict(SAMPLING), **row()) == []

    server = FakeServerManager(tokenizer, turns_script(lookup_call("France"), "\\boxed{Paris}"), abort_on_call=2)
    loop, _ = build_loop(tokenizer, server)
    (output,) = await loop.rollout(dict(SAMPLING), **row())
    extra = output.extra_fields
    assert extra["infra_failure"] is True and extra["termination_reason"] == "engine_error"
    assert "aborted" in extra["infra_error"] and extra["final_answer"] == ""
    assert len(output.response_ids) > 0  # flagged, kept as sampled: run() hands verl none of it


async def test_a_cut_generation_that_reads_as_a_tool_call_never_runs_it_and_is_dropped(tokenizer) -> None:
    # verl's servers cut the call (stop reason "aborted", the tokens sampled so far handed back): a complete call.
    script = turns_script(Cut(lookup_call("France")), "\\boxed{Paris}")
    LOOKUPS.clear()
    server = FakeServerManager(tokenizer, script)
    loop, _ = build_loop(tokenizer, server)
    outcome = RolloutOutcome()

    assert await loop.run(dict(SAMPLING), **row(), rllm_outcome=outcome) == []
    assert LOOKUPS == [] and len(server.calls) == 1  # the tool never ran, and nothing was generated after
    assert tokenizer.decode(server.calls[0]["token_ids"]) == lookup_call("France")
    assert outcome.dropped and outcome.cause.startswith("GenerationAbortedError: ")

    loop, _ = build_loop(tokenizer, FakeServerManager(tokenizer, script))
    (output,) = await loop.rollout(dict(SAMPLING), **row())
    extra = output.extra_fields
    assert extra["termination_reason"] == "engine_error" and extra["infra_failure"] is True
    assert output.response_ids == [] and output.response_mask == []  # the cut turn is not in the trace
    assert LOOKUPS == []


async def test_a_cancelled_rollout_is_dropped_not_trained_with_reward_zero(tokenizer) -> None:
    # The tool cancels the run (as Strands' stop tool does): no answer, and not the policy's outcome either.
    def build(*overrides: str) -> tuple[StrandsAgentLoop, FakeServerManager]:
        server = FakeServerManager(tokenizer, turns_script(lookup_call("France"), "\\boxed{Paris}"))
        loop, _ = build_loop(tokenizer, server, *overrides, tool_factory="fixtures.verl_loop:cancelling_tools",
                             tool_kwargs={})
        return loop, server

    LOOKUPS.clear()
    loop, server = build()
    outcome = RolloutOutcome()
    assert await loop.run(dict(SAMPLING), **row(), rllm_outcome=outcome) == []
    assert LOOKUPS == ["France"] and len(server.calls) == 1  # stopped after the tool round
    assert outcome.dropped and outcome.cause == "cancelled"

    loop, _ = build()
    (output,) = await loop.rollout(dict(SAMPLING), **row())
    extra = output.extra_fields
    assert extra["termination_reason"] == "cancelled" and extra["infra_failure"] is False
    assert extra["final_answer"] == ""  # flagged; run() hands verl none of it


async def test_the_embedded_engine_aborting_a_written_tool_call_drops_the_rollout(tokenizer, tmp_path) -> None:
    # The real TransformersEngine behind the embedded rollout server, its tiny model forced to write the call;
    # the engine aborts right after it (what the server's abort_all_requests does at a weight sync).
    from rllm.offline.tiny_models import ForcedCausalLM, build_tiny_qwen3
    from rllm.training.verl.embedded.server import EmbeddedRolloutServer

    build_tiny_qwen3(tokenizer, out_dir=tmp_path)
    config = compose(f"actor_rollout_ref.model.path={tmp_path}", "actor_rollout_ref.rollout.dtype=float32",
                     "actor_rollout_ref.rollout.max_model_len=4096", "actor_rollout_ref.rollout.max_num_seqs=1")
    embedded = EmbeddedRolloutServer(config.actor_rollout_ref.rollout, config.actor_rollout_ref.model, 0, device="cpu")
    engine = embedded.engine
    engine.model = ForcedCausalLM(engine.model, tokenizer.encode(lookup_call("France")), tokenizer.encode("\n")[0],
                                  on_written=engine.abort)
    client = EmbeddedServerClient(embedded)
    loop, _ = build_loop(tokenizer, client)
    LOOKUPS.clear()

    assert await loop.run(dict(SAMPLING), **row()) == []
    assert LOOKUPS == [] and engine.stats.aborted == 1
    [answer] = client.answers
    assert answer.stop_reason == "aborted"
    assert tokenizer.decode(answer.token_ids) == lookup_call("France") + "\n"  # a complete call, cut


async def test_tool_error_is_the_policys_but_a_dead_tool_backend_is_infrastructure(tokenizer) -> None:
    # A tool raising on a bad argument: the model sees the error and carries on; the rollout counts.
    server = FakeServerManager(tokenizer, turns_script(lookup_call("bad"), "\\boxed{Paris}"))
    loop, _ = build_loop(tokenizer, server)
    (output,) = await loop.run(dict(SAMPLING), **row())
    assert isinstance(output, AgentLoopOutput) and output.extra_fields["infra_failure"] is False
    tool_turn = tokenizer.decode(server.calls[1]["prompt_ids"][len(server.calls[0]["prompt_ids"]):])
    assert "<tool_response>" in tool_turn and "no entry named 'bad'" in tool_turn
    assert output.extra_fields["final_answer"] == "\\boxed{Paris}"

    # The tool's backend failing, marked by the tool itself: excluded, and no further generation is spent on it.
    dead = FakeServerManager(tokenizer, turns_script(lookup_call("France"), "\\boxed{Paris}"))
    loop, _ = build_loop(tokenizer, dead, fail_with="backend")
    assert await loop.run(dict(SAMPLING), **row()) == []
    assert len(dead.calls) == 1
    dead = FakeServerManager(tokenizer, turns_script(lookup_call("France"), "\\boxed{Paris}"))
    loop, _ = build_loop(tokenizer, dead, fail_with="backend")
    (flagged,) = await loop.rollout(dict(SAMPLING), **row())
    extra = flagged.extra_fields
    assert extra["infra_failure"] is True and extra["termination_reason"] == "tool_backend_error"
    assert extra["infra_error"] == ("tool 'lookup' failed: ToolBackendError: "
                                    "encyclopedia backend at 127.0.0.1:9 refused the connection")


async def test_a_third_party_tool_exception_is_infrastructure_only_when_configured(tokenizer) -> None:
    # By default a raw httpx error from a tool is just an error the model reads (no regex, no guessing).
    server = FakeServerManager(tokenizer, turns_script(lookup_call("France"), "\\boxed{Paris}"))
    loop, _ = build_loop(tokenizer, server, fail_with="connect")
    (output,) = await loop.run(dict(SAMPLING), **row())
    assert isinstance(output, AgentLoopOutput) and output.extra_fields["infra_failure"] is False
    assert len(server.calls) == 2
    # Named in the loop's infra_exceptions, it marks the backend failed.
    server = FakeServerManager(tokenizer, turns_script(lookup_call("France"), "\\boxed{Paris}"))
    loop, _ = build_loop(tokenizer, server, fail_with="connect", infra_exceptions=["httpx.TransportError"])
    assert await loop.run(dict(SAMPLING), **row()) == [] and len(server.calls) == 1


async def test_an_unexpected_error_raises_out_of_run_with_its_cause(tokenizer) -> None:
    class Garbled(FakeServerManager):
        async def generate(self, *args: Any, **kwargs: Any) -> TokenOutput:
            out = await super().generate(*args, **kwargs)
            return out.model_copy(update={"log_probs": out.log_probs[:-1]})  # one logprob short

    loop, _ = build_loop(tokenizer, Garbled(tokenizer, turns_script("\\boxed{Paris}")))
    with pytest.raises(ValueError, match="token ids but .* logprobs"):
        await loop.run(dict(SAMPLING), **row())


async def test_a_hung_rollout_times_out_as_infrastructure(tokenizer) -> None:
    class Hung(FakeServerManager):
        async def generate(self, *args: Any, **kwargs: Any) -> TokenOutput:
            self.calls.append({})
            await asyncio.sleep(30)
            raise AssertionError("unreachable")

    loop, _ = build_loop(tokenizer, Hung(tokenizer, turns_script("x")), timeout_s=0.2)
    (output,) = await loop.rollout(dict(SAMPLING), **row())
    assert output.extra_fields["termination_reason"] == "timeout" and output.extra_fields["infra_failure"] is True


async def test_a_prompt_longer_than_prompt_length_is_a_config_error(tokenizer) -> None:
    server = FakeServerManager(tokenizer, turns_script("\\boxed{Paris}"))
    loop, _ = build_loop(tokenizer, server, "data.max_prompt_length=32")
    with pytest.raises(PromptTooLongError, match="rollout.prompt_length is 32"):
        await loop.run(dict(SAMPLING), **row())
    assert server.calls == []


async def test_a_row_without_a_system_message_takes_the_blocks_or_is_refused_before_any_call(tokenizer) -> None:
    from fixtures.verl_loop import QUESTION

    bare = row(raw_prompt=[{"role": "user", "content": QUESTION}])
    server = FakeServerManager(tokenizer, turns_script("\\boxed{Paris}"))
    loop, _ = build_loop(tokenizer, server, system_prompt=None)
    with pytest.raises(ConfigurationError, match="the row's prompt has no system message and "
                                                 "rllm.agent_loop.system_prompt is null"):
        await loop.run(dict(SAMPLING), **bare)
    assert server.calls == []
    loop, _ = build_loop(tokenizer, server, system_prompt="Answer in a box, briefly.")
    (output,) = await loop.run(dict(SAMPLING), **bare)
    first = tokenizer.decode(output.prompt_ids)
    assert first.startswith("<|im_start|>system\nAnswer in a box, briefly.\n")
    assert f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n" in first


async def test_rows_without_logprobs_and_verl_tools_are_handled_explicitly(tokenizer) -> None:
    server = FakeServerManager(tokenizer, turns_script("\\boxed{Paris}"))
    loop, _ = build_loop(tokenizer, server, "actor_rollout_ref.rollout.calculate_log_probs=false")
    (output,) = await loop.run({**SAMPLING, "logprobs": False}, **row())
    assert output.response_logprobs is None and output.response_mask == [1] * len(output.response_ids)

    with pytest.raises(ConfigurationError, match="tool_config_path"):
        StrandsAgentLoop(
            trainer_config=DictConfigWrap(loop.config), server_manager=server, tokenizer=tokenizer, processor=None,
            dataset_cls=RLHFDataset, data_config=DictConfigWrap(loop.config.data), tools=ToolListWrap([object()]),
        )


def test_lookup_stand_in_is_importable_by_dotted_path() -> None:
    from rllm.training.verl.agent_loop import build_tools

    tools = build_tools("fixtures.verl_loop:lookup_tools", {"fail_with": None})
    assert [t.tool_name for t in tools] == ["lookup"]
    assert build_tools("fixtures.verl_loop:lookup_tools", {"fail_with": None})[0] is tools[0]  # built once per process
    with pytest.raises(ImportError, match="no_such_factory"):
        build_tools("fixtures.verl_loop:no_such_factory")


# --- the real search tool (the YAML's default factory) against a real retrieval server ---------


@pytest.fixture(scope="module")
def retrieval_server(tmp_path_factory) -> Any:
    from rag.build_index import build_demo_index
    from rag.testing import RetrievalServer

    index_dir = tmp_path_factory.mktemp("rag-index")
    build_demo_index(index_dir, limit=40, progress=False)  # MiniLM over 40 shipped HotpotQA paragraphs
    with RetrievalServer(index_dir) as server:
        yield server


async def test_real_search_tool_against_a_real_retrieval_server(tokenizer, retrieval_server, monkeypatch) -> None:
    monkeypatch.setenv("RETRIEVAL_SERVER_URL", retrieval_server.base_url)  # read by the recipe's tool_kwargs
    server = FakeServerManager(tokenizer, search_then_answer_with_top_title)
    loop, _ = build_loop(tokenizer, server, stand_in_tool=False)
    assert loop.settings.block.tool_factory == "rllm.agents.search:search_tools"
    assert loop.settings.block.tool_kwargs == {"retrieval_url": retrieval_server.base_url}

    (output,) = await loop.run(dict(SAMPLING), **row())

    hits = await loop_search(retrieval_server.base_url, "Beer Hunter whisky brewery")
    assert output.extra_fields["final_answer"] == f"\\boxed{{{hits[0]['title']}}}"
    tool_tokens = [t for t, m in zip(output.response_ids, output.response_mask) if m == 0]
    assert hits[0]["contents"][:60] in tokenizer.decode(tool_tokens)
    assert output.extra_fields["num_tool_calls"] == 1 and output.extra_fields["infra_failure"] is False


async def loop_search(base_url: str, query: str) -> list[dict[str, Any]]:
    from rag.client import RetrievalClient

    client = RetrievalClient(base_url)
    try:
        return await client.search(query, 3)
    finally:
        await client.aclose()


async def test_real_search_tool_with_the_retrieval_server_down_is_excluded(tokenizer, monkeypatch) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    monkeypatch.setenv("RETRIEVAL_SERVER_URL", closed)
    server = FakeServerManager(tokenizer, search_then_answer_with_top_title)
    loop, _ = build_loop(tokenizer, server, stand_in_tool=False)

    assert await loop.run(dict(SAMPLING), **row()) == []
    assert len(server.calls) == 1  # no generation spent after the dead search



async def test_a_users_agent_whose_history_is_rewritten_is_stored_by_verl_as_one_row_per_sample(tokenizer,
                                                                                               monkeypatch) -> None:
    # The recipe names a factory that returns a plain strands.Agent under Strands' per-turn sliding window.
    replies = [lookup_call(key) for key in ("France", "Paris", "France", "Paris")] + ["It is \\boxed{Paris}."]
    calls: list[int] = []

    def script(prompt: str) -> str:
        calls.append(1)
        return replies[len(calls) - 1]

    server = FakeServerManager(tokenizer, script)
    loop, config = build_loop(tokenizer, server, tool_factory=None, agent_factory="fixtures.verl_loop:windowed_agent")
    LOOKUPS.clear()

    outputs = await loop.run(dict(SAMPLING), **row())

    assert LOOKUPS == ["France", "Paris", "France", "Paris"] and len(server.calls) == 5
    assert len(outputs) > 1  # the window rewrote the history: several samples, not an error
    assert [o.extra_fields["sample_index"] for o in outputs] == list(range(len(outputs)))
    assert {o.extra_fields["num_samples"] for o in outputs} == {len(outputs)}
    assert outputs[-1].extra_fields["final_answer"] == "It is \\boxed{Paris}."
    # Each sample exact: every sampled token once, in order, with the server's logprobs; nothing else trainable.
    assert [t for o in outputs for t, m in zip(o.response_ids, o.response_mask, strict=True) if m] == [
        t for c in server.calls for t in c["token_ids"]]
    assert [lp for o in outputs for lp, m in zip(o.response_logprobs, o.response_mask, strict=True) if m] == [
        lp for c in server.calls for lp in c["log_probs"]]
    # A later sample's prompt is what the server was sent for that sample's first call.
    firsts = [c["prompt_ids"] for c in server.calls]
    assert all(o.prompt_ids in firsts for o in outputs)

    worker, stored = verls_v1_worker(config, tokenizer, monkeypatch)
    await worker._agent_loop_postprocess(outputs, False, **row())

    (put,) = stored
    assert put["keys"] == [f"u-0_0_{i}" for i in range(len(outputs))]  # verl's rows: one per sample
    # The last sample is scored (the final answer is in it) and its reward copied to every sample.
    assert [sum(scores.tolist()) for scores in put["fields"]["rm_scores"]] == [1.0] * len(outputs)


async def test_a_swarm_from_the_factory_is_one_rollout_whose_node_samples_verl_stores_as_rows(tokenizer,
                                                                                             monkeypatch) -> None:
    from fixtures.verl_loop import team_script

    server = FakeServerManager(tokenizer, team_script)
    loop, config = build_loop(tokenizer, server, tool_factory=None, agent_factory="fixtures.verl_loop:research_team")
    LOOKUPS.clear()

    outputs = await loop.run(dict(SAMPLING), **row())

    assert LOOKUPS == ["France"] and len(server.calls) == 4  # lookup, handoff, "handed off", the answer
    assert [o.extra_fields["agent"] for o in outputs] == ["researcher", "writer"]
    assert outputs[-1].extra_fields["final_answer"] == "It is \\boxed{Paris}."
    assert [t for o in outputs for t, m in zip(o.response_ids, o.response_mask, strict=True) if m] == [
        t for c in server.calls for t in c["token_ids"]]

    worker, stored = verls_v1_worker(config, tokenizer, monkeypatch)
    await worker._agent_loop_postprocess(outputs, False, **row())
    (put,) = stored
    assert put["keys"] == ["u-0_0_0", "u-0_0_1"]  # one rollout: the team's episode, a row per node sample
    assert [sum(scores.tolist()) for scores in put["fields"]["rm_scores"]] == [1.0, 1.0]  # one reward, on both


async def test_an_agent_factory_that_returns_no_agent_is_a_configuration_error_naming_the_key(tokenizer) -> None:
    server = FakeServerManager(tokenizer, turns_script("\\boxed{Paris}"))
    loop, _ = build_loop(tokenizer, server, tool_factory=None, agent_factory="fixtures.verl_loop:not_an_agent")
    with pytest.raises(ConfigurationError, match=r"agent_factory=fixtures.verl_loop:not_an_agent: an agent factory "
                                                 r"returned a str, not a Strands Agent, Swarm or Graph"):
        await loop.run(dict(SAMPLING), **row())
    assert server.calls == []


async def test_an_agent_factory_that_builds_on_another_model_is_refused(tokenizer) -> None:
    server = FakeServerManager(tokenizer, turns_script("\\boxed{Paris}"))
    loop, _ = build_loop(tokenizer, server, tool_factory=None,
                         agent_factory="fixtures.verl_loop:agent_on_its_own_model")
    with pytest.raises(ConfigurationError, match="build it on the model it is given"):
        await loop.run(dict(SAMPLING), **row())
    assert server.calls == []


def _restore_policy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    from rllm.tracing.policy_server import API_KEY_ENV, BASE_URL_ENV, MODEL_ENV

    for name in (BASE_URL_ENV, API_KEY_ENV, MODEL_ENV):
        monkeypatch.setenv(name, "unset by the test")


def _windowed_replies() -> Any:
    replies = [lookup_call(key) for key in ("France", "Paris", "France", "Paris")] + ["It is \\boxed{Paris}."]
    calls: list[int] = []

    def script(prompt: str) -> str:
        calls.append(1)
        return replies[len(calls) - 1]

    return script


async def _windowed_on_the_model(tokenizer: Any) -> tuple[FakeServerManager, list[AgentLoopOutput]]:
    """The windowed agent on the rollout's model: its server (what it was asked) and the loop's outputs."""
    server = FakeServerManager(tokenizer, _windowed_replies())
    loop, _ = build_loop(tokenizer, server, tool_factory=None, agent_factory="fixtures.verl_loop:windowed_agent")
    return server, await loop.run(dict(SAMPLING), **row())


async def test_an_agent_on_its_own_openai_client_trains_on_the_rows_the_same_agent_on_the_model_gives(
        tokenizer, monkeypatch) -> None:
    # The user's agent keeps Strands' own streaming OpenAIModel; the worker serves it the policy over HTTP.
    on_model, expected = await _windowed_on_the_model(tokenizer)

    own = FakeServerManager(tokenizer, _windowed_replies())
    loop, config = build_loop(tokenizer, own, tool_factory=None, own_client=True,
                              agent_factory="fixtures.verl_loop:windowed_agent_on_its_own_client")
    server = PolicyServer()
    _restore_policy_env(monkeypatch)  # the loop exports the server's address to this process
    LOOKUPS.clear()
    try:
        outputs = await loop.run(dict(SAMPLING), **row(), **{POLICY_SERVER_KWARG: server})
    finally:
        await server.stop()

    assert LOOKUPS == ["France", "Paris", "France", "Paris"] and len(own.calls) == 5
    assert [c["prompt_ids"] for c in own.calls] == [c["prompt_ids"] for c in on_model.calls]
    assert len(outputs) == len(expected) > 1  # the window rewrote the history: several samples
    for mine, theirs in zip(outputs, expected, strict=True):
        assert (mine.prompt_ids, mine.response_ids, mine.response_mask, mine.response_logprobs) == (
            theirs.prompt_ids, theirs.response_ids, theirs.response_mask, theirs.response_logprobs)
        assert mine.extra_fields == theirs.extra_fields
    worker, stored = verls_v1_worker(config, tokenizer, monkeypatch)
    await worker._agent_loop_postprocess(outputs, False, **row())
    (put,) = stored
    assert [sum(scores.tolist()) for scores in put["fields"]["rm_scores"]] == [1.0] * len(outputs)


async def test_with_own_client_an_agent_built_on_the_model_it_is_given_still_runs_on_it(tokenizer,
                                                                                        monkeypatch) -> None:
    _, expected = await _windowed_on_the_model(tokenizer)
    server = FakeServerManager(tokenizer, _windowed_replies())
    loop, _ = build_loop(tokenizer, server, tool_factory=None, own_client=True,
                         agent_factory="fixtures.verl_loop:windowed_agent")
    _restore_policy_env(monkeypatch)
    policy = PolicyServer()
    try:
        outputs = await loop.run(dict(SAMPLING), **row(), **{POLICY_SERVER_KWARG: policy})
    finally:
        await policy.stop()
    assert [(o.prompt_ids, o.response_ids, o.response_mask) for o in outputs] == [
        (o.prompt_ids, o.response_ids, o.response_mask) for o in expected]
    assert policy.get_session("any") == []  # nothing went through the server

    loop, _ = build_loop(tokenizer, server, tool_factory=None, own_client=True,
                         agent_factory="fixtures.verl_loop:windowed_agent_on_its_own_client")
    with pytest.raises(ConfigurationError, match="own_client needs rllm's agent-loop worker"):
        await loop.run(dict(SAMPLING), **row())


async def test_a_non_finite_reward_at_the_step_is_refused_naming_the_task(tokenizer) -> None:
    """The user's reward returning NaN in a RewardOutput stops the step (the manager fails it), naming the task."""
    server = FakeServerManager(tokenizer, turns_script("It is \\boxed{Paris}."))
    loop, _ = build_loop(tokenizer, server, "rllm.reward_fn=fixtures.user_agents:nan_reward")
    with pytest.raises(ConfigurationError, match=r"reward function nan_reward returned RewardOutput\(reward=nan\); "
                                                 r"it returns a RewardOutput or a finite number \(scoring task "
                                                 r"id='q0' \(dataset row 0\)\)"):
        await loop.run(dict(SAMPLING), **row())
