"""``TokenSession`` counts the calls that extended it and those whose rewritten history started a sample.

The engine is ``MessageScriptedEngine`` on Qwen3's real tokenizer and template; a failure is injected
from outside (a subclass whose n-th ``_generate`` raises), as a throttled backend would.
"""

from __future__ import annotations

from typing import Any

import pytest

from rllm.errors import EngineThrottledError
from rllm.offline.chat_templates import FAMILIES
from rllm.offline.scripted_tokens import MessageScriptedEngine


class _ThrottledAt(MessageScriptedEngine):
    def __init__(self, fail_at: int) -> None:
        family = FAMILIES["qwen3"]
        super().__init__(family.tokenizer(), lambda m: {"content": f"answer {len(m)}"},
                         tool_parser=family.tool_parser, chat_template_kwargs=family.chat_template_kwargs)
        self.fail_at, self.calls = fail_at, 0

    async def _generate(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls == self.fail_at:
            raise EngineThrottledError("busy", url="http://rollout", cause="429")
        return await super()._generate(*args, **kwargs)


async def test_a_rewritten_call_is_counted_once_even_when_it_failed_and_was_retried() -> None:
    engine = _ThrottledAt(fail_at=3)
    session = engine.new_session()
    first = [{"role": "user", "content": "one"}]
    answer = await engine.get_model_response(first, session=session)
    appended = [*first, {"role": "assistant", "content": answer.text}, {"role": "user", "content": "two"}]
    answer = await engine.get_model_response(appended, session=session)
    rewritten = [{"role": "user", "content": "a summary of one and two"}]  # a conversation manager's rewrite
    with pytest.raises(EngineThrottledError):
        await engine.get_model_response(rewritten, session=session)
    assert (session.calls, session.rewritten_calls, len(session.samples)) == (2, 0, 1)  # as before the call

    await engine.get_model_response(rewritten, session=session)  # the retry starts the sample, once
    assert (session.calls, session.rewritten_calls, len(session.samples)) == (3, 1, 2)
    assert [trace.num_turns for trace in session.samples] == [2, 1]
