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

from typing import Any

import pytest
import torch
from fixtures.verl_loop import SAMPLING, build_loop, lookup_call, row
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
from verl.utils.torch_functional import logprobs_from_logits
from verl.workers.rollout.replica import TokenOutput

from rllm.testing.chat_templates import FAMILIES
from rllm.testing.tiny_models import build_tiny_qwen3

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

    output = await loop.rollout(dict(SAMPLING), **row())

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
