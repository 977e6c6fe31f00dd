"""``TransformersEngine``: a local Hugging Face causal LM as a token-in/token-out engine.

No server: the model samples in this process (CPU or GPU) and the logprob of each sampled token
is read from the same processed scores it was sampled from. It is the embedded default for small
models and what the offline tests run on.
"""

from __future__ import annotations

import asyncio
from typing import Any

from rllm.engine.rollout.token_engine import TokenEngine, TokenOutput, TokenSession


class TransformersEngine(TokenEngine):
    """Samples with ``model.generate`` one request at a time.

    Args:
        model: A loaded ``PreTrainedModel`` or a path / hub name to load with ``AutoModelForCausalLM``.
        tokenizer: The model's tokenizer, or ``None`` to load it from ``model``'s path.
        device: Where to run (``"cpu"``, ``"cuda"``); default: the model's device.
        **kwargs: As for ``TokenEngine`` (tool_parser, context_length, sampling defaults, ...).
    """

    def __init__(self, model: Any, tokenizer: Any = None, *, device: str | None = None, **kwargs: Any) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if isinstance(model, str):
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(model)
            model = AutoModelForCausalLM.from_pretrained(model)
        if tokenizer is None:
            raise ValueError("TransformersEngine needs the tokenizer when given a loaded model")
        if device is not None:
            model = model.to(device)
        self.model = model.eval()
        kwargs.setdefault("context_length", getattr(model.config, "max_position_embeddings", 32768))
        super().__init__(tokenizer, **kwargs)
        self._lock = asyncio.Lock()

    async def _generate(self, prompt_ids: list[int], max_new_tokens: int, sampling: dict[str, Any], session: TokenSession) -> TokenOutput:
        async with self._lock:  # one generate at a time; the model is not shared across threads
            return await asyncio.to_thread(self._generate_sync, prompt_ids, max_new_tokens, sampling)

    def _generate_sync(self, prompt_ids: list[int], max_new_tokens: int, sampling: dict[str, Any]) -> TokenOutput:
        import torch

        temperature = float(sampling.get("temperature", 1.0))
        stop_ids = {self.renderer.probe.end_of_turn_id}
        if self.tokenizer.eos_token_id is not None:
            stop_ids.add(self.tokenizer.eos_token_id)
        options: dict[str, Any] = {"do_sample": temperature > 0}
        if temperature > 0:
            options.update(temperature=temperature, top_p=float(sampling.get("top_p", 1.0)),
                           top_k=int(sampling.get("top_k", 0)))
        if "seed" in sampling:
            torch.manual_seed(int(sampling["seed"]))
        inputs = torch.tensor([prompt_ids], device=self.model.device)
        with torch.inference_mode():
            generated = self.model.generate(
                inputs,
                attention_mask=torch.ones_like(inputs),
                max_new_tokens=max_new_tokens,
                eos_token_id=sorted(stop_ids),
                pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id,
                output_scores=True,
                return_dict_in_generate=True,
                **options,
            )
        new_ids = generated.sequences[0, len(prompt_ids) :].tolist()
        logprobs = [
            float(torch.log_softmax(scores[0].float(), dim=-1)[token].item())
            for scores, token in zip(generated.scores, new_ids, strict=False)
        ]
        finish = "stop" if new_ids and new_ids[-1] in stop_ids else "length"
        return TokenOutput(token_ids=new_ids, logprobs=logprobs, finish_reason=finish)
