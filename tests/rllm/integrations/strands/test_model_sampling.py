"""In training the trainer samples: ``RLLMModel`` over verl's engine sends none of a factory's sampling.

A factory that sets ``params={"temperature": 0.3}`` (with ``update_config`` or at construction) keeps
it for evaluation, where the engine receives it; in training verl's sampling for the rollout reaches
the server, with one warning a process naming the keys, and ``max_tokens`` stays a cap (the smaller wins).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

pytest.importorskip("verl", reason="verl's engine and agent loop: the train extra")

from fixtures.verl_loop import (  # noqa: E402
    FACTORY_SAMPLING,
    SAMPLING,
    FakeServerManager,
    build_loop,
    lookup_call,
    row,
    turns_script,
)

from rllm.engine.rollout import OpenAIEngine  # noqa: E402
from rllm.engine.rollout.verl_engine import VerlEngine  # noqa: E402
from rllm.integrations.strands import RLLMModel  # noqa: E402
from rllm.integrations.strands import model as model_module  # noqa: E402
from rllm.tracing.policy_request import IgnoredSampling  # noqa: E402

MESSAGES = [{"role": "user", "content": [{"text": "What is the capital of France?"}]}]
WARNING = "RLLMModel ignores in training the sampling its params set"


@pytest.fixture(autouse=True)
def _fresh_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as a new process: no key warned about yet."""
    monkeypatch.setattr(model_module, "_IGNORED", IgnoredSampling(model_module._IGNORED.who))


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if WARNING in r.getMessage()]


async def _call(model: RLLMModel) -> None:
    async for _ in model.stream(MESSAGES):
        pass


async def test_verls_loop_samples_with_the_trainers_sampling_whatever_the_factory_sets(
        tokenizer: Any, caplog: pytest.LogCaptureFixture) -> None:
    server = FakeServerManager(tokenizer, turns_script(lookup_call("France"), "It is \\boxed{Paris}."))
    loop, _ = build_loop(tokenizer, server, tool_factory=None, max_tokens_per_turn=48,
                         agent_factory="fixtures.verl_loop:agent_with_its_own_sampling")
    with caplog.at_level(logging.WARNING, logger="rllm.integrations.strands.model"):
        for session in range(2):  # two rollouts in one worker: one warning
            await loop.run(dict(SAMPLING), **row(session_id=session))

    sent = [call["sampling_params"] for call in server.calls]
    assert len(sent) == 4
    for params in sent:
        assert {key: params[key] for key in ("temperature", "top_p", "top_k")} == {
            "temperature": SAMPLING["temperature"], "top_p": SAMPLING["top_p"], "top_k": SAMPLING["top_k"]}
        assert params["max_tokens"] <= 48  # the loop's per-turn cap, under the factory's 4096
    (warning,) = _warnings(caplog)
    assert warning.startswith(f"{WARNING} (temperature, top_p): the trainer samples")
    assert "your factory's params stay as they are for evaluation" in warning


@pytest.mark.parametrize(("built", "updated", "expected"), [
    pytest.param(64, 16, 16, id="the factory's smaller cap"),
    pytest.param(16, 64, 16, id="the trainer's smaller cap"),
    pytest.param(None, 24, 24, id="the factory's cap alone"),
])
async def test_max_tokens_stays_a_cap_in_training(tokenizer: Any, built: int | None, updated: int,
                                                  expected: int) -> None:
    server = FakeServerManager(tokenizer, lambda prompt: "Paris.")
    engine = VerlEngine(server, tokenizer, response_length=512, server_sampling=SAMPLING)
    model = RLLMModel(engine, params={} if built is None else {"max_tokens": built})
    model.update_config(params={"max_tokens": updated})
    await _call(model)
    assert server.calls[-1]["sampling_params"]["max_tokens"] == expected


async def test_sampling_a_factory_passes_at_construction_is_the_trainers_too(
        tokenizer: Any, caplog: pytest.LogCaptureFixture) -> None:
    server = FakeServerManager(tokenizer, lambda prompt: "Paris.")
    engine = VerlEngine(server, tokenizer, response_length=512, server_sampling=SAMPLING)
    model = RLLMModel(engine, params={"temperature": 0.3, "seed": 7})
    with caplog.at_level(logging.WARNING, logger="rllm.integrations.strands.model"):
        await _call(model)
        await _call(RLLMModel(engine, params={"top_k": 5}))  # a key not seen before: still the one warning
    assert model.trainer_samples
    assert all(call["sampling_params"]["temperature"] == 1.0 and "seed" not in call["sampling_params"]
               and call["sampling_params"]["top_k"] == -1 for call in server.calls)
    assert [w.split(":")[0] for w in _warnings(caplog)] == [f"{WARNING} (seed, temperature)"]
    assert model.get_config()["params"] == {"temperature": 0.3, "seed": 7}  # kept as set, for evaluation


async def test_in_evaluation_the_factorys_sampling_applies(serve: Any, caplog: pytest.LogCaptureFixture) -> None:
    server = serve()
    model = RLLMModel(OpenAIEngine(model="m", base_url=server.base_url))
    with caplog.at_level(logging.WARNING, logger="rllm.integrations.strands.model"):
        model.update_config(params=dict(FACTORY_SAMPLING))
        await _call(model)
    assert not model.trainer_samples
    (request,) = server.requests
    assert (request["temperature"], request["top_p"], request["max_tokens"]) == (0.3, 0.5, 4096)
    assert _warnings(caplog) == []
