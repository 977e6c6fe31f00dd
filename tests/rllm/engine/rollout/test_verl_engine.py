"""The trainer's view: verl recomputes exactly the log-probs the rollout sampled with (ratio 1 at step 0).

Real pieces throughout: Qwen's real tokenizer with Qwen3's shipped chat template, a tiny random
``Qwen3ForCausalLM`` sized to that 151,669-token vocabulary, the ``StrandsAgentLoop`` built from the
recipe as verl builds it, verl's own ``AgentLoopWorker._agent_loop_postprocess`` (left-padded
prompt, right-padded response, attention mask, position ids) and verl's ``logprobs_from_logits``.
The stand-in is the rollout server: it runs the tiny model token by token on the prompt ids it is
sent, the first turn forced to a tool call (a random model never writes one) and the second
sampled freely, and reports the model's own log-prob of every token it returns.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch
from fixtures.verl_loop import SAMPLING, build_loop, compose, lookup_call, row
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
from verl.utils.torch_functional import logprobs_from_logits
from verl.workers.rollout.replica import TokenOutput

from rllm.offline.chat_templates import FAMILIES
from rllm.offline.tiny_models import build_tiny_qwen3

pytestmark = [pytest.mark.slow, pytest.mark.verl]

PROMPT_LENGTH, RESPONSE_LENGTH = 512, 256


class TinyModelServer:
    """verl's ``LLMServerClient.generate`` backed by a tiny Qwen3: forced or sampled tokens, the model's logprobs."""

    def __init__(self, model: Any, tokenizer: Any, forced: list[str | None], end_of_turn_id: int) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.forced = forced
        self.end_of_turn_id = end_of_turn_id
        self.calls: list[dict[str, Any]] = []

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       **kwargs: Any) -> TokenOutput:
        turn = len(self.calls)
        text = self.forced[turn] if turn < len(self.forced) else None
        forced = None if text is None else [*self.tokenizer.encode(text, add_special_tokens=False), self.end_of_turn_id]
        generator = torch.Generator().manual_seed(turn)
        ids, out, logprobs = list(prompt_ids), [], []
        with torch.inference_mode():
            for step in range(min(sampling_params["max_tokens"], len(forced) if forced else 8)):
                logits = self.model(torch.tensor([ids]), logits_to_keep=1).logits[0, -1].float()
                logp = torch.log_softmax(logits / sampling_params["temperature"], dim=-1)
                token = forced[step] if forced else int(torch.multinomial(logp.exp(), 1, generator=generator))
                out.append(token)
                logprobs.append(float(logp[token]))
                ids.append(token)
                if token == self.end_of_turn_id:
                    break
        self.calls.append({"prompt_ids": list(prompt_ids), "token_ids": out})
        return TokenOutput(token_ids=out, log_probs=logprobs, stop_reason="completed", num_preempted=0,
                           extra_fields={"global_steps": 0, "min_global_steps": 0, "max_global_steps": 0})


@pytest.fixture(scope="module")
def qwen3() -> tuple[Any, Any]:
    tokenizer = FAMILIES["qwen3"].tokenizer()
    return tokenizer, build_tiny_qwen3(tokenizer)


async def test_verl_recomputes_the_rollouts_logprobs_on_every_sampled_token(qwen3: tuple[Any, Any]) -> None:
    tokenizer, model = qwen3
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    server = TinyModelServer(model, tokenizer, [lookup_call("France")], end_of_turn)
    loop, config = build_loop(tokenizer, server, f"data.max_prompt_length={PROMPT_LENGTH}",
                              f"data.max_response_length={RESPONSE_LENGTH}")

    (output,) = await loop.rollout(dict(SAMPLING), **row())

    assert len(server.calls) == 2 and output.num_turns >= 2  # a tool turn, then a sampled turn
    assert sum(output.response_mask) == sum(len(call["token_ids"]) for call in server.calls)
    # What verl stores: the worker's own padding, masks and positions.
    worker = AgentLoopWorker.__new__(AgentLoopWorker)  # no Ray actor: only its post-processing runs
    worker.rollout_config = config.actor_rollout_ref.rollout
    worker.tokenizer, worker.processor, worker.mm_processor_kwargs = tokenizer, None, {}
    worker.reward_loop_worker_handles, worker.distillation_enabled = None, False
    batch = await worker._agent_loop_postprocess(output, False, **row())
    assert batch.input_ids.shape == (1, PROMPT_LENGTH + RESPONSE_LENGTH)
    assert batch.prompt_ids[0, 0] == tokenizer.pad_token_id  # left-padded prompt

    # The actor's step-0 forward: teacher-forced over the padded batch, fp32, verl's logprob function.
    with torch.inference_mode():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids,
                       logits_to_keep=RESPONSE_LENGTH + 1).logits[:, :-1].float()
        recomputed = logprobs_from_logits(logits, batch.response_ids)
    mask = batch.response_mask[0].bool()
    rollout = batch.response_logprobs[0][mask]
    assert int(mask.sum()) == sum(len(call["token_ids"]) for call in server.calls)
    ratio = torch.exp(recomputed[0][mask] - rollout)
    assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-4), (ratio.min(), ratio.max())
    # Masked-out tokens (the tool result) are context: no logprob was claimed for them.
    assert batch.response_logprobs[0][~mask].abs().sum() == 0


# --- cancelling: verl's own server client, a real Ray actor behind verl's own load balancer ---------------------


@pytest.fixture(scope="module")
def ray_local() -> Any:
    import os

    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=1, include_dashboard=False, _temp_dir=os.environ.get("RAY_TMPDIR"), log_to_driver=False)
    yield ray
    if started:
        ray.shutdown()


def _held_server(ray: Any, answer_ids: list[int]) -> Any:
    """A rollout-server actor whose ``generate`` answers ``answer_ids`` once ``release`` is called."""

    class HeldServer:
        def __init__(self) -> None:
            self.request_ids: list[str] = []
            self.released = asyncio.Event()

        async def generate(self, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any],
                           **kwargs: Any) -> Any:
            from verl.workers.rollout.replica import TokenOutput as VerlTokenOutput

            self.request_ids.append(request_id)
            await self.released.wait()
            return VerlTokenOutput(token_ids=answer_ids, log_probs=[-0.1] * len(answer_ids), stop_reason="completed",
                                   num_preempted=0, extra_fields={"global_steps": 0})

        async def seen(self) -> list[str]:
            return list(self.request_ids)

        async def release(self) -> None:
            self.released.set()

    return ray.remote(HeldServer).remote()


async def test_cancel_on_an_agent_over_verls_server_client_fails_loudly_and_the_rollout_runs_on(
        qwen3: tuple[Any, Any], ray_local: Any) -> None:
    from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient, LLMServerClient
    from verl.workers.rollout.router import get_router_handle

    from rllm.engine.rollout.verl_engine import VerlEngine
    from rllm.errors import AbortUnsupportedError
    from rllm.integrations.strands import RLLMModel, StrandsAgent
    from rllm.types import TerminationReason

    # verl offers no per-request abort on its clients; if a release adds one, VerlEngine should use it.
    for client_cls in (LLMServerClient, FullyAsyncLLMServerClient):
        assert not any("abort" in name for name in dir(client_cls)), client_cls
    tokenizer, _ = qwen3
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    server = _held_server(ray_local, [*tokenizer.encode("\\boxed{4}", add_special_tokens=False), end_of_turn])
    config = compose()
    # As LLMServerManager builds it: verl's load balancer actor over the servers, and get_client()'s constructor call.
    router = get_router_handle(servers={"127.0.0.1:0": server},
                               full_determinism=config.actor_rollout_ref.rollout.full_determinism)
    client = LLMServerClient(config=config, load_balancer_handle=router)
    agent = StrandsAgent(RLLMModel(VerlEngine(client, tokenizer, response_length=64)))

    run = asyncio.create_task(agent.invoke_async("What is 2 + 2?"))
    for _ in range(2400):  # up to two minutes: a loaded CI machine starts verl's router and client slowly
        if await server.seen.remote():
            break
        await asyncio.sleep(0.05)
    [sent_id] = await server.seen.remote()
    with pytest.raises(AbortUnsupportedError, match="LLMServerClient cannot abort one request"):
        agent.cancel()
    agent.cancel(after_current_tools=True)  # stops before the next model call: needs no abort, so allowed
    await server.release.remote()
    result = await asyncio.wait_for(run, 60)

    assert sent_id != agent.token_session.request_id  # verl's client sent its own id: none of ours to abort
    assert result.stop_reason == "end_turn" and agent.termination_reason is TerminationReason.FINISHED
    assert agent.trajectory.steps[-1].model_output.text == "\\boxed{4}"


# --- the response budget is the rollout's: every sample of every session the engine served ---------------------


def _short_answers(tokenizer: Any) -> Any:
    from fixtures.verl_loop import FakeServerManager

    return FakeServerManager(tokenizer, lambda prompt: "word " * 10)


def _rewritten(turn: int) -> list[dict[str, Any]]:
    """A history a conversation manager rewrote: each call's is no extension of the last, so a sample starts."""
    return [{"role": "system", "content": "Answer."}, {"role": "user", "content": f"question {turn}"}]


async def _call_until_exhausted(engine: Any, sessions: list[Any]) -> int:
    """Call the engine round-robin over ``sessions``, each call a rewritten history, until the budget ends it."""
    from rllm.errors import ResponseBudgetExhaustedError

    for turn in range(100):
        try:
            await engine.get_model_response(_rewritten(turn), session=sessions[turn % len(sessions)])
        except ResponseBudgetExhaustedError as error:
            assert "rollout.response_length allows" in str(error)
            return turn
    raise AssertionError("the budget never ended the rollout")


async def test_a_rollout_split_into_samples_gets_the_budget_of_an_unsplit_one() -> None:
    from fixtures.verl_loop import SAMPLING

    from rllm.engine.rollout.verl_engine import VerlEngine
    from rllm.offline.tiny_models import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    server = _short_answers(tokenizer)
    engine = VerlEngine(server, tokenizer, response_length=120, server_sampling=SAMPLING)
    session = engine.new_session()

    calls = await _call_until_exhausted(engine, [session])

    sampled = [len(call["token_ids"]) for call in server.calls]
    assert calls == len(server.calls) > 2
    assert sum(1 for t in session.samples if t.num_turns) == calls  # one sample per rewritten call
    assert sum(sampled) == 120  # the rollout's 120 tokens over all its samples, not 120 each
    assert server.calls[-1]["sampling_params"]["max_tokens"] == 120 - sum(sampled[:-1])  # the last is clamped
    assert engine.response_tokens() == sum(len(t) - t.prompt_length for t in session.samples) == 120


async def test_a_teams_sessions_share_the_rollouts_budget() -> None:
    from fixtures.verl_loop import SAMPLING

    from rllm.engine.rollout.verl_engine import VerlEngine
    from rllm.offline.tiny_models import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    server = _short_answers(tokenizer)
    engine = VerlEngine(server, tokenizer, response_length=120, server_sampling=SAMPLING)
    researcher, writer = engine.new_session(), engine.new_session()

    await _call_until_exhausted(engine, [researcher, writer])

    assert {call["request_id"] for call in server.calls} == {researcher.request_id, writer.request_id}
    assert sum(len(call["token_ids"]) for call in server.calls) == 120  # both nodes' samples, one budget
