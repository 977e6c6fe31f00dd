r"""Incremental chat-template rendering: each call renders only what was appended since the last.

The first call renders the whole conversation with the generation prompt. Later calls render
only the new messages (tool results, new user turns) as a token delta that follows the tokens the
model sampled, so the model's own tokens, ``<think>`` blocks and end-of-turn tokens included, are
never rendered again.

Messages reach the template the way vLLM's chat endpoint hands them over: every text block of a
message joined into one string with ``"\n"`` (real templates do not take lists of blocks: some
crash, some silently render nothing), and tool-call arguments as JSON objects rather than strings.
Content a text-only policy cannot take (an image, say) is an error, never dropped.

The delta is cut out of a render of a short stand-in conversation: a user turn, the model's last
turn with a sentinel for its text (its tool calls kept, since some templates read them when
rendering the results), then the new messages and the generation prompt; everything after the
end-of-turn token that closes the sentinel turn is the delta, the separator the template writes
after that token included. Because the stand-in turn is never the last one, templates that render
the last assistant turn differently (Qwen3's empty think block) cannot leak into the delta.

Every renderer checks itself when it is built, on a conversation with a system prompt, tools,
parallel tool calls, reasoning and a second user turn: each delta must be exactly the tail of a
full render of the same conversation, token for token. A template that fails is refused then,
with its name and what broke, never halfway through a rollout.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Any

from rllm.errors import TemplateError, UnsupportedContentError

logger = logging.getLogger(__name__)

_SENTINEL = "RLLM_SENTINEL_7f3a"
_PROBE_USER = {"role": "user", "content": "x"}

_CHECK_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look up a key.",
            "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
        },
    }
]


def _call(call_id: str, key: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "lookup", "arguments": json.dumps({"key": key})}}


# The self-check conversation: reasoning, a tool round, parallel calls with multi-block results,
# an answer, a second user turn and its answer.
_CHECK_CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You answer with the lookup tool."},
    {"role": "user", "content": [{"type": "text", "text": "What is the code"}, {"type": "text", "text": "of box 7?"}]},
    {"role": "assistant", "reasoning_content": "I need box 7.", "content": "Looking it up.",
     "tool_calls": [_call("call_0", "box 7")]},
    {"role": "tool", "tool_call_id": "call_0", "content": [{"type": "text", "text": "item 12"}]},
    {"role": "assistant", "reasoning_content": "Now both.", "content": "",
     "tool_calls": [_call("call_1", "item 12"), _call("call_2", "box 8")]},
    {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "code 42"},
                                                           {"type": "text", "text": "(verified)"}]},
    {"role": "tool", "tool_call_id": "call_2", "content": "Error: no such key"},
    {"role": "assistant", "reasoning_content": "Done.", "content": "The code is 42."},
    {"role": "user", "content": "And box 8?"},
    {"role": "assistant", "content": "There is no box 8."},
]


@dataclass(frozen=True)
class TemplateProbe:
    """What probing the template found.

    Attributes:
        end_of_turn_id: The token that closes an assistant turn (``<|im_end|>`` for Qwen).
        end_of_turn_text: That token's text.
        think_prefilled: The generation prompt opens a ``<think>`` block the model continues.
    """

    end_of_turn_id: int
    end_of_turn_text: str
    think_prefilled: bool


def content_text(content: Any, sep: str = "") -> str:
    """The text of an OpenAI-format message content, leniently.

    A string as is, else its blocks' texts joined with ``sep``. Blocks without text (an image) and
    anything that is not a block add nothing; ``None`` is "". ``flatten_content`` is the strict
    reading a chat template gets.
    """
    if isinstance(content, str):
        return content
    return sep.join(part.get("text", "") for part in content or [] if isinstance(part, dict))


def flatten_content(content: Any, where: str) -> str:
    r"""One string for a message's content: its text blocks joined with ``"\n"``, as vLLM does.

    Raises ``UnsupportedContentError`` for any block that is not text (an image, audio, a file).
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise UnsupportedContentError(f"{where}: content of type {type(content).__name__} is neither text nor blocks")
    texts: list[str] = []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind != "text" or not isinstance(block.get("text"), str):
            raise UnsupportedContentError(
                f"{where} has a {kind or type(block).__name__!r} content block; a text-only policy cannot take it"
            )
        texts.append(block["text"])
    return "\n".join(texts)


def _template_message(message: dict[str, Any], index: int) -> dict[str, Any]:
    out = copy.deepcopy(message)
    out["content"] = flatten_content(message.get("content"), f"message {index} ({message.get('role')})")
    for call in out.get("tool_calls") or []:
        function = call.get("function", {})
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                parsed = json.loads(arguments) if arguments.strip() else {}
            except ValueError:
                continue  # kept as written; a template that needs an object will say so
            if isinstance(parsed, dict):
                function["arguments"] = parsed
    return out


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` as a chat template takes them: flat text content, tool-call arguments as objects."""
    return [_template_message(m, i) for i, m in enumerate(messages)]


def template_name(tokenizer: Any) -> str:
    """A name for the tokenizer's chat template in messages: its tokenizer and a short hash."""
    template = getattr(tokenizer, "chat_template", None) or ""
    digest = hashlib.sha256(template.encode("utf-8")).hexdigest()[:12] if isinstance(template, str) else "?"
    return f"{getattr(tokenizer, 'name_or_path', '') or type(tokenizer).__name__} (template sha256 {digest})"


class ChatRenderer:
    """Renders OpenAI-format messages with a Hugging Face tokenizer's chat template.

    Args:
        tokenizer: A tokenizer with a chat template.
        chat_template_kwargs: Extra template variables (e.g. ``enable_thinking``).
        name: What to call the template in errors (default: tokenizer name and template hash).

    Raises:
        TemplateError: The template cannot be rendered incrementally.
    """

    def __init__(
        self, tokenizer: Any, chat_template_kwargs: dict[str, Any] | None = None, *, name: str | None = None
    ) -> None:
        self.tokenizer = tokenizer
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.name = name or template_name(tokenizer)
        self.probe = self._probe()
        self._check_incremental()

    def render_text(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, generation_prompt: bool
    ) -> str:
        """The template's text for ``messages``."""
        prepared = template_messages(messages)
        try:
            return self.tokenizer.apply_chat_template(
                prepared, tools=tools or None, add_generation_prompt=generation_prompt, tokenize=False,
                **self.chat_template_kwargs,
            )
        except Exception as error:  # jinja2 errors, raise_exception() in templates, TypeErrors on bad input
            raise TemplateError(f"chat template {self.name} failed to render {len(messages)} messages: "
                                f"{type(error).__name__}: {error}") from error

    def encode(self, text: str) -> list[int]:
        """Token ids of rendered text (the template already wrote every special token)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        """The whole conversation with the generation prompt: the first call's prompt."""
        return self.encode(self.render_text(messages, tools, True))

    def delta_text(self, last_assistant: dict[str, Any], new_messages: list[dict[str, Any]],
                   tools: list[dict[str, Any]] | None) -> str:
        """Text the template writes after ``last_assistant``'s end-of-turn token for ``new_messages``."""
        stand_in = {"role": "assistant", "content": _SENTINEL}
        if last_assistant.get("tool_calls"):
            stand_in["tool_calls"] = last_assistant["tool_calls"]
        full = self.render_text([_PROBE_USER, stand_in, *new_messages], tools, True)
        if full.count(_SENTINEL) != 1:
            raise TemplateError(f"chat template {self.name} does not render an assistant turn's text exactly once")
        after = full.split(_SENTINEL, 1)[1]
        end = after.find(self.probe.end_of_turn_text)
        if end < 0:
            raise TemplateError(f"chat template {self.name} writes no {self.probe.end_of_turn_text!r} after an "
                                "assistant turn that is followed by other messages")
        return after[end + len(self.probe.end_of_turn_text):]

    def delta_ids(self, last_assistant: dict[str, Any], new_messages: list[dict[str, Any]],
                  tools: list[dict[str, Any]] | None, *, after_end_of_turn: bool) -> list[int]:
        """Tokens that follow a sampled assistant turn: the new messages and the generation prompt.

        ``after_end_of_turn`` says whether the sampled tokens already end with the end-of-turn
        token; when they do not (a stop string, say), the delta supplies it.
        """
        ids = self.encode(self.delta_text(last_assistant, new_messages, tools))
        return ids if after_end_of_turn else [self.probe.end_of_turn_id, *ids]

    def _probe(self) -> TemplateProbe:
        closed = self.render_text([_PROBE_USER, {"role": "assistant", "content": _SENTINEL}], None, False)
        if _SENTINEL not in closed:
            raise TemplateError(f"chat template {self.name} does not render an assistant message's content")
        tail = closed.split(_SENTINEL, 1)[1]
        tail_ids = self.encode(tail)
        if not tail_ids:
            raise TemplateError(f"chat template {self.name} writes no end-of-turn token after an assistant message")
        end_of_turn_id = tail_ids[0]
        end_text = self.tokenizer.decode([end_of_turn_id], skip_special_tokens=False)
        if not tail.startswith(end_text):
            raise TemplateError(f"chat template {self.name}: cannot locate the end-of-turn token in {tail!r}")
        open_prompt = self.render_text([_PROBE_USER], None, True)
        generation_prompt = open_prompt[len(self.render_text([_PROBE_USER], None, False)) :]
        probe = TemplateProbe(
            end_of_turn_id=end_of_turn_id,
            end_of_turn_text=end_text,
            think_prefilled="<think>" in generation_prompt and "</think>" not in generation_prompt,
        )
        logger.debug("chat template probe of %s: %s", self.name, probe)
        return probe

    def _check_incremental(self) -> None:
        """Raise ``TemplateError`` unless each delta is the tail of the full render, token for token."""
        conversation = _CHECK_CONVERSATION
        for index, message in enumerate(conversation):
            if message["role"] != "assistant" or index + 1 >= len(conversation):
                continue
            end = index + 1
            while end < len(conversation) and conversation[end]["role"] != "assistant":
                end += 1
            new = conversation[index + 1 : end]
            delta = self.delta_ids(message, new, _CHECK_TOOLS, after_end_of_turn=True)
            full = self.prompt_ids(conversation[:end], _CHECK_TOOLS)
            if full[len(full) - len(delta) :] != delta or full[len(full) - len(delta) - 1] != self.probe.end_of_turn_id:
                roles = "+".join(m["role"] for m in new)
                raise TemplateError(
                    f"chat template {self.name} cannot be rendered incrementally: the {roles} messages after an "
                    f"assistant turn render as {self.tokenizer.decode(delta)!r} on their own, which is not what "
                    f"the full conversation ends with after {self.probe.end_of_turn_text!r}: "
                    f"{self.tokenizer.decode(full[-len(delta) - 1 :])!r}"
                )
