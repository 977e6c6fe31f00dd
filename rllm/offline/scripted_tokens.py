"""Scripted token-level policies: chosen text emitted as real token ids, in process or over HTTP.

A script maps the decoded prompt to the text the "model" answers; the text is encoded with the
real tokenizer and closed with the end-of-turn token, and each token gets a deterministic
logprob (a script answering ``Cut(text)`` has the generation cut, finish reason ``abort``, as a
server aborting the request does). ``ScriptedTokenEngine`` does this in process;
``ScriptedTokenServer`` serves the same script as SGLang's ``POST /generate`` and vLLM's
``POST /v1/completions`` on 127.0.0.1, recording every request, so the HTTP engines are tested
end to end.

``MessageScriptedEngine`` scripts at the level of messages instead: its script answers with an
OpenAI assistant message (reasoning, content, tool calls), and the engine samples exactly the text
the model's own chat template writes for that message, so one script speaks every family's
format (Hermes JSON calls, Qwen3-Coder XML calls, think blocks or none).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request

from rllm.engine.rollout.token_engine import TokenEngine, TokenOutput, TokenSession
from rllm.offline.scripted_server import ScriptedOpenAIServer
from rllm.tokens.renderer import ChatRenderer


@dataclass(frozen=True)
class Cut:
    """A scripted answer the server cuts: ``text`` is sampled without the end-of-turn token, then ``finish_reason``.

    ``Cut(text)`` is what SGLang, vLLM and ``TransformersEngine.abort`` hand back for an aborted request.
    """

    text: str
    finish_reason: str = "abort"


TokenScript = Callable[[str], "str | Cut"]
MessageScript = Callable[[list[dict[str, Any]]], "dict[str, Any] | str"]


def scripted_completion(tokenizer: Any, end_of_turn_id: int, script: TokenScript, prompt_ids: list[int],
                        max_new_tokens: int) -> TokenOutput:
    """The token output for ``script(decoded prompt)``, cut at ``max_new_tokens`` (or as a ``Cut`` says)."""
    answer = script(tokenizer.decode(prompt_ids, skip_special_tokens=False))
    if isinstance(answer, Cut):
        return _sampled(tokenizer.encode(answer.text, add_special_tokens=False), max_new_tokens,
                        finish=answer.finish_reason)
    return _sampled([*tokenizer.encode(answer, add_special_tokens=False), end_of_turn_id], max_new_tokens)


def _sampled(ids: list[int], max_new_tokens: int, *, finish: str = "stop") -> TokenOutput:
    """``ids`` cut at ``max_new_tokens``, each with a deterministic logprob; ``finish`` unless the budget cuts them."""
    finish = finish if len(ids) <= max_new_tokens else "length"
    ids = ids[:max_new_tokens]
    return TokenOutput(token_ids=ids, logprobs=[-0.01 * (1 + i % 7) for i in range(len(ids))], finish_reason=finish)


class ScriptedTokenEngine(TokenEngine):
    """A token engine whose samples come from a text script through the real tokenizer."""

    def __init__(self, tokenizer: Any, script: TokenScript | MessageScript, **kwargs: Any) -> None:
        super().__init__(tokenizer, **kwargs)
        self.script: Any = script
        self.prompts: list[list[int]] = []

    async def _generate(self, prompt_ids: list[int], max_new_tokens: int, sampling: dict[str, Any],
                        session: TokenSession) -> TokenOutput:
        self.prompts.append(list(prompt_ids))
        return scripted_completion(self.tokenizer, self.renderer.probe.end_of_turn_id, self.script, prompt_ids,
                                   max_new_tokens)


def template_assistant_text(renderer: ChatRenderer, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                            assistant: dict[str, Any]) -> str:
    """What the chat template writes for ``assistant`` after ``messages``' generation prompt.

    Up to and including its end-of-turn token: the text a model trained on the template samples.
    """
    prompt = renderer.render_text(messages, tools, True)
    closed = renderer.render_text([*messages, {"role": "assistant", **assistant}], tools, False)
    if not closed.startswith(prompt):
        raise ValueError("the template renders this assistant message so that it does not follow its own "
                         "generation prompt (e.g. reasoning with thinking disabled)")
    text = closed[len(prompt) :]
    end = renderer.probe.end_of_turn_text
    return text[: text.index(end) + len(end)]


class MessageScriptedEngine(ScriptedTokenEngine):
    """A token engine whose policy answers with assistant messages, sampled in the template's own format.

    ``script(messages)`` gets the conversation as sent (OpenAI format) and returns either an
    assistant message (``{"content", "reasoning_content", "tool_calls"}``, arguments as JSON
    strings) or raw text for turns no template would write (a malformed call, say), which is
    sampled as written and closed with the end-of-turn token.
    """

    async def _generate(self, prompt_ids: list[int], max_new_tokens: int, sampling: dict[str, Any],
                        session: TokenSession) -> TokenOutput:
        self.prompts.append(list(prompt_ids))
        answer = self.script(session.messages)
        if isinstance(answer, str):
            text = answer + self.renderer.probe.end_of_turn_text
        else:
            text = template_assistant_text(self.renderer, session.messages, session.tools, answer)
        return _sampled(self.renderer.encode(text), max_new_tokens)


class ScriptedTokenServer(ScriptedOpenAIServer):
    """SGLang ``/generate`` and vLLM ``/v1/completions`` answering from a token script.

    ``fail_first`` makes the first N requests answer 500, to exercise retries.
    """

    def __init__(self, tokenizer: Any, end_of_turn_id: int, script: TokenScript, *, fail_first: int = 0) -> None:
        self.tokenizer = tokenizer
        self.end_of_turn_id = end_of_turn_id
        self.token_script = script
        self.token_requests: list[dict[str, Any]] = []
        self._failures_left = fail_first
        self._token_lock = threading.Lock()
        super().__init__()

    @property
    def root_url(self) -> str:
        """Server root without ``/v1`` (SGLang's convention)."""
        return self.base_url.removesuffix("/v1")

    def _record(self, body: dict[str, Any], headers: dict[str, str]) -> bool:
        with self._token_lock:
            self.token_requests.append({**body, "_headers": headers})
            if self._failures_left > 0:
                self._failures_left -= 1
                return False
        return True

    def _build_app(self) -> FastAPI:
        app = super()._build_app()

        @app.post("/generate")
        async def generate(request: Request) -> Any:
            body = await request.json()
            if not self._record(body, dict(request.headers)):
                return _server_error()
            params = body["sampling_params"]
            out = scripted_completion(self.tokenizer, self.end_of_turn_id, self.token_script, body["input_ids"],
                                      params["max_new_tokens"])
            return {
                "text": self.tokenizer.decode(out.token_ids, skip_special_tokens=False),
                "output_ids": out.token_ids,
                "meta_info": {
                    "output_token_logprobs": [
                        [lp, i, None] for lp, i in zip(out.logprobs or [], out.token_ids, strict=False)
                    ],
                    "finish_reason": {"type": out.finish_reason},
                    "prompt_tokens": len(body["input_ids"]),
                    "completion_tokens": len(out.token_ids),
                },
            }

        @app.post("/v1/completions")
        async def completions(request: Request) -> Any:
            body = await request.json()
            if not self._record(body, dict(request.headers)):
                return _server_error()
            out = scripted_completion(self.tokenizer, self.end_of_turn_id, self.token_script, body["prompt"],
                                      body["max_tokens"])
            return {
                "object": "text_completion",
                "choices": [{
                    "index": 0,
                    "text": self.tokenizer.decode(out.token_ids, skip_special_tokens=False),
                    "token_ids": out.token_ids,
                    "logprobs": {"token_logprobs": out.logprobs, "tokens": [str(i) for i in out.token_ids]},
                    "finish_reason": out.finish_reason,
                }],
                "prompt_token_ids": body["prompt"],
            }

        return app


def _server_error() -> Any:
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": {"message": "scripted failure", "code": 500}}, status_code=500)
