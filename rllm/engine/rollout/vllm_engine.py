"""``VLLMEngine``: token-in/token-out over vLLM's completions API with token-id prompts."""

from __future__ import annotations

from typing import Any

from rllm.engine.rollout.http import JSONClient
from rllm.engine.rollout.token_engine import TokenEngine, TokenOutput, TokenSession

_PASS_THROUGH = ("temperature", "top_p", "top_k", "min_p", "seed", "stop", "presence_penalty",
                 "frequency_penalty", "repetition_penalty")


class VLLMEngine(TokenEngine):
    """Sends the rollout's token ids as the ``prompt`` of ``/v1/completions``.

    vLLM then never re-renders the conversation: the prompt is exactly the trace, and
    ``return_token_ids`` with ``logprobs`` gives the sampled ids and their logprobs.

    Args:
        base_url: Server root including ``/v1``, e.g. ``http://127.0.0.1:30000/v1``.
        model: Served model name.
        tokenizer: The served model's tokenizer.
        timeout: Seconds one HTTP request may take before it counts as failed (and is retried).
        max_retries: Retries after the first attempt for retryable failures.
        backoff_initial: First backoff in seconds; doubles each retry, jittered.
        backoff_max: Cap on one backoff, in seconds.
        **kwargs: As for ``TokenEngine``.
    """

    def __init__(self, base_url: str, model: str, tokenizer: Any, *, timeout: float = 600.0, max_retries: int = 5,
                 backoff_initial: float = 0.5, backoff_max: float = 30.0, **kwargs: Any) -> None:
        super().__init__(tokenizer, **kwargs)
        self.model = model
        self.client = JSONClient(base_url, timeout=timeout, max_retries=max_retries,
                                 backoff_initial=backoff_initial, backoff_max=backoff_max)

    async def _generate(self, prompt_ids: list[int], max_new_tokens: int, sampling: dict[str, Any],
                        session: TokenSession) -> TokenOutput:
        payload = {
            "model": self.model,
            "prompt": prompt_ids,
            "max_tokens": max_new_tokens,
            "logprobs": 1,
            "return_token_ids": True,
            "skip_special_tokens": False,
            "include_stop_str_in_output": True,
            **{k: v for k, v in sampling.items() if k in _PASS_THROUGH},
        }
        answer = await self.client.post("/completions", payload, headers={"X-Session-ID": session.request_id})
        choice = answer["choices"][0]
        ids = [int(i) for i in choice["token_ids"]]
        logprobs = [float(lp) for lp in (choice.get("logprobs") or {}).get("token_logprobs") or []]
        if len(logprobs) != len(ids):
            raise ValueError(f"vLLM returned {len(ids)} token ids but {len(logprobs)} logprobs")
        reason = choice.get("finish_reason") or "stop"
        return TokenOutput(token_ids=ids, logprobs=logprobs,
                           finish_reason={"length": "length", "abort": "abort"}.get(reason, "stop"))
