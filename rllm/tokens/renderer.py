"""Incremental chat-template rendering: each call renders only what was appended since the last.

The first call renders the whole conversation with the generation prompt. Later calls render
only the new messages (tool results, user turns) as a token delta that follows the tokens the
model sampled, so the model's own tokens, ``<think>`` blocks and end-of-turn tokens included, are
never rendered again. What a template puts between turns (Qwen's newline after ``<|im_end|>``)
is found by probing the template with sentinel messages, not hard-coded per model.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

_SENTINEL = "RLLM_SENTINEL_7f3a"
_PROBE_USER = {"role": "user", "content": "x"}


class TemplateError(ValueError):
    """The chat template cannot be rendered incrementally (it is not append-only)."""


@dataclass(frozen=True)
class TemplateProbe:
    """What probing the template found.

    Attributes:
        end_of_turn_id: The token that closes an assistant turn (``<|im_end|>`` for Qwen).
        separator: Text the template puts after that token before the next turn.
        think_prefilled: The generation prompt opens a ``<think>`` block the model continues.
    """

    end_of_turn_id: int
    separator: str
    think_prefilled: bool


class ChatRenderer:
    """Renders OpenAI-format messages with a Hugging Face tokenizer's chat template.

    Args:
        tokenizer: A tokenizer with a chat template.
        chat_template_kwargs: Extra template variables (e.g. ``enable_thinking``).
    """

    def __init__(self, tokenizer: Any, chat_template_kwargs: dict[str, Any] | None = None) -> None:
        self.tokenizer = tokenizer
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.probe = self._probe()

    def render_text(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, generation_prompt: bool) -> str:
        """The template's text for ``messages``."""
        return self.tokenizer.apply_chat_template(
            messages, tools=tools or None, add_generation_prompt=generation_prompt, tokenize=False,
            **self.chat_template_kwargs,
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of rendered text (the template already wrote every special token)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        """The whole conversation with the generation prompt: the first call's prompt."""
        return self.encode(self.render_text(messages, tools, True))

    def delta_ids(
        self, new_messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, *, after_end_of_turn: bool
    ) -> list[int]:
        """Tokens that follow a sampled assistant turn: the new messages and the generation prompt.

        ``after_end_of_turn`` says whether the sampled tokens already end with the end-of-turn
        token; when they do not (a stop string, say), the delta supplies it.
        """
        # Render the new messages after a probe conversation that ends in an assistant turn and
        # keep only what they add; the probe has no reasoning, so no template drops anything.
        base_messages = [_PROBE_USER, {"role": "assistant", "content": _SENTINEL}]
        base = self.render_text(base_messages, tools, False)
        full = self.render_text(base_messages + new_messages, tools, True)
        if not full.startswith(base):
            raise TemplateError("the chat template re-renders earlier turns when messages are appended")
        text = self.probe.separator + full[len(base) :]
        ids = self.encode(text)
        return ids if after_end_of_turn else [self.probe.end_of_turn_id, *ids]

    def _probe(self) -> TemplateProbe:
        closed = self.render_text([_PROBE_USER, {"role": "assistant", "content": _SENTINEL}], None, False)
        tail = closed.split(_SENTINEL, 1)[1]
        tail_ids = self.encode(tail)
        if not tail_ids:
            raise TemplateError("the chat template writes no end-of-turn token after an assistant message")
        end_of_turn_id = tail_ids[0]
        end_text = self.tokenizer.decode([end_of_turn_id], skip_special_tokens=False)
        if not tail.startswith(end_text):
            raise TemplateError(f"cannot locate the end-of-turn token in {tail!r}")
        open_prompt = self.render_text([_PROBE_USER], None, True)
        generation_prompt = open_prompt[len(self.render_text([_PROBE_USER], None, False)) :]
        probe = TemplateProbe(
            end_of_turn_id=end_of_turn_id,
            separator=tail[len(end_text) :],
            think_prefilled="<think>" in generation_prompt and "</think>" not in generation_prompt,
        )
        logger.debug("chat template probe: %s", probe)
        return probe
