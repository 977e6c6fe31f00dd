"""``SGLangEngine``: token-in/token-out over SGLang's native ``POST /generate``."""

from __future__ import annotations

from typing import Any

from rllm.engine.rollout.http import JSONClient
from rllm.engine.rollout.token_engine import TokenEngine, TokenOutput, TokenSession

_SGLANG_SAMPLING = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                    "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
                    "repetition_penalty": "repetition_penalty", "stop": "stop", "seed": "sampling_seed"}


class SGLangEngine(TokenEngine):
    """Sends the rollout's token ids to ``/generate`` and reads the sampled ids and logprobs back.

    ``logprob_start_len`` is the prompt length minus one, so SGLang computes no prompt logprobs
    and its radix cache matches the whole earlier rollout (SGLang caps prefix matching at that
    length; 0 would re-prefill every turn). Every turn of a rollout carries the rollout's
    session id in ``X-Session-ID`` for routers that pin a session to one replica.

    Args:
        base_url: Server or router root, e.g. ``http://127.0.0.1:30000``.
        tokenizer: The served model's tokenizer.
        timeout: Seconds one HTTP request may take before it counts as failed (and is retried).
        max_retries: Retries after the first attempt for retryable failures.
        backoff_initial: First backoff in seconds; doubles each retry, jittered.
        backoff_max: Cap on one backoff, in seconds.
        **kwargs: As for ``TokenEngine``.
    """

    def __init__(self, base_url: str, tokenizer: Any, *, timeout: float = 600.0, max_retries: int = 5,
                 backoff_initial: float = 0.5, backoff_max: float = 30.0, **kwargs: Any) -> None:
        super().__init__(tokenizer, **kwargs)
        self.client = JSONClient(base_url, timeout=timeout, max_retries=max_retries,
                                 backoff_initial=backoff_initial, backoff_max=backoff_max)

    async def _generate(self, prompt_ids: list[int], max_new_tokens: int, sampling: dict[str, Any],
                        session: TokenSession) -> TokenOutput:
        params = {_SGLANG_SAMPLING[k]: v for k, v in sampling.items() if k in _SGLANG_SAMPLING}
        params.update(max_new_tokens=max_new_tokens, skip_special_tokens=False, no_stop_trim=True)
        payload = {
            "input_ids": prompt_ids,
            "sampling_params": params,
            "return_logprob": True,
            "logprob_start_len": max(len(prompt_ids) - 1, 0),
            "rid": f"{session.request_id}-{session.trace.num_turns}",
            "stream": False,
        }
        answer = await self.client.post("/generate", payload, headers={"X-Session-ID": session.request_id})
        meta = answer["meta_info"]
        pairs = meta["output_token_logprobs"]
        ids = [int(entry[1]) for entry in pairs]
        if "output_ids" in answer and list(answer["output_ids"]) != ids:
            raise ValueError("SGLang returned output_ids that differ from the ids of output_token_logprobs")
        reason = (meta.get("finish_reason") or {}).get("type", "stop")
        return TokenOutput(token_ids=ids, logprobs=[float(entry[0]) for entry in pairs],
                           finish_reason={"abort": "abort", "length": "length"}.get(reason, "stop"))
