"""The tiny offline Qwen3 tokenizer round-trips text, renders Qwen3's chat format, and the tiny model generates."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from rllm.offline.tiny_models import (
    ADDED_TOKENS,
    CHAT_TEMPLATE,
    SPECIAL_TOKENS,
    build_tiny_model_dir,
    build_tiny_qwen3,
    build_tiny_tokenizer,
)

logger = logging.getLogger(__name__)

_WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}

_CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": [{"type": "text", "text": "What is the weather in "},
                                 {"type": "text", "text": "Paris and Tokyo?"}]},
    {"role": "assistant", "content": None, "reasoning_content": "I should check both cities.",
     "tool_calls": [
         {"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
         {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Tokyo"}}},
     ]},
    {"role": "tool", "tool_call_id": "call_0", "content": "Sunny, 23C"},
    {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "Rainy, 18C"}]},
    {"role": "assistant", "content": "Paris is sunny and Tokyo is rainy.", "reasoning_content": "Both results are in."},
]

_EXPECTED = (
    "<|im_start|>system\n"
    "You are a helpful assistant.\n\n"
    "# Tools\n\n"
    "These functions are available to you; their signatures are listed between <tools> and </tools>:\n"
    "<tools>\n"
    '{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather for a city.", '
    '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}\n'
    "</tools>\n\n"
    "To call a function, write one JSON object with its name and arguments between <tool_call> and </tool_call>, "
    "one block per call:\n"
    "<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call><|im_end|>\n"
    "<|im_start|>user\n"
    "What is the weather in Paris and Tokyo?<|im_end|>\n"
    "<|im_start|>assistant\n"
    "<think>\nI should check both cities.\n</think>\n\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Tokyo"}}\n</tool_call><|im_end|>\n'
    "<|im_start|>user\n"
    "<tool_response>\nSunny, 23C\n</tool_response>\n"
    "<tool_response>\nRainy, 18C\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n"
    "<think>\nBoth results are in.\n</think>\n\n"
    "Paris is sunny and Tokyo is rainy.<|im_end|>\n"
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the tiny tokenizer and model once for the module."""
    start = time.perf_counter()
    out = build_tiny_model_dir(tmp_path_factory.mktemp("tiny_qwen3"))
    logger.info("tiny model build took %.2fs", time.perf_counter() - start)
    return out


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> transformers.PreTrainedTokenizerBase:
    return transformers.AutoTokenizer.from_pretrained(model_dir)


def _render(tok: transformers.PreTrainedTokenizerBase, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    return tok.apply_chat_template(messages, tokenize=False, **kwargs)


@pytest.mark.parametrize("text", [
    "plain ascii text",
    "héllo wörld — naïve café 🤖🚀 中文字符 日本語 עברית",
    '{"name": "search", "arguments": {"query": "Ünïcode ✓", "k": [1, 2.5, null]}}',
    "line one\nline two\r\n\n\ttabbed   spaces  \n",
    "e\u0301 vs \u00e9 (not NFC-normalized)\u200b\x00\x7f",
    "<tool_call>\n{}\n</tool_call> and <think>x</think><|im_end|> mixed in",
    "",
])
def test_encode_decode_round_trips_exactly(tokenizer: Any, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=False) == text


def test_special_and_added_tokens_are_single_ids(tokenizer: Any) -> None:
    assert tokenizer.pad_token == "<|endoftext|>" and tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.bos_token is None
    ids = {token: tokenizer.encode(token, add_special_tokens=False) for token in SPECIAL_TOKENS + ADDED_TOKENS}
    assert all(len(v) == 1 for v in ids.values()), ids
    assert len({v[0] for v in ids.values()}) == len(ids)
    for token in ADDED_TOKENS:  # markup tokens are text, not control tokens
        assert tokenizer.decode(ids[token], skip_special_tokens=True) == token
    for token in SPECIAL_TOKENS:
        assert tokenizer.decode(ids[token], skip_special_tokens=True) == ""
    # Inside running text they still come out as their own single ids.
    ids_in_text = tokenizer.encode("a<tool_call>b</tool_call>c<|im_end|>", add_special_tokens=False)
    assert ids["<tool_call>"][0] in ids_in_text and ids["<|im_end|>"][0] in ids_in_text
    assert len(tokenizer) == 1500 + len(SPECIAL_TOKENS) + len(ADDED_TOKENS)


def test_tokenizer_training_is_deterministic(tokenizer: Any) -> None:
    again = build_tiny_tokenizer()
    assert again.get_vocab() == tokenizer.get_vocab()
    text = json.dumps(_CONVERSATION)
    assert again.encode(text) == tokenizer.encode(text)


def test_chat_template_renders_full_tool_conversation_exactly(tokenizer: Any) -> None:
    assert tokenizer.chat_template == CHAT_TEMPLATE
    assert _render(tokenizer, _CONVERSATION, tools=[_WEATHER_TOOL]) == _EXPECTED
    ids = tokenizer.apply_chat_template(_CONVERSATION, tools=[_WEATHER_TOOL], tokenize=True, return_dict=True)
    ids = ids["input_ids"]
    assert tokenizer.decode(ids) == _EXPECTED
    assert ids.count(tokenizer.convert_tokens_to_ids("<tool_response>")) == 2
    # two calls + the two mentions in the tools section: always one id, even inside prose
    assert ids.count(tokenizer.convert_tokens_to_ids("<tool_call>")) == 4


def test_consecutive_tool_messages_share_one_user_turn(tokenizer: Any) -> None:
    rendered = _render(tokenizer, _CONVERSATION[1:5])
    assert rendered.count("<|im_start|>user\n") == 2  # the question and one tool-response turn
    assert rendered.endswith(
        "<|im_start|>user\n<tool_response>\nSunny, 23C\n</tool_response>\n"
        "<tool_response>\nRainy, 18C\n</tool_response><|im_end|>\n"
    )
    single = _render(tokenizer, _CONVERSATION[1:4])
    assert single.endswith("<|im_start|>user\n<tool_response>\nSunny, 23C\n</tool_response><|im_end|>\n")


def test_system_only_and_generation_prompt(tokenizer: Any) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert _render(tokenizer, messages, add_generation_prompt=True) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert _render(tokenizer, messages[1:], add_generation_prompt=True, enable_thinking=True) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_enable_thinking_false_prefills_empty_think_block(tokenizer: Any) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    assert _render(tokenizer, messages, add_generation_prompt=True, enable_thinking=False) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    assert _render(tokenizer, messages, add_generation_prompt=False, enable_thinking=False) == (
        "<|im_start|>user\nHi<|im_end|>\n"
    )


_TWO_QUESTIONS: list[dict[str, Any]] = [
    {"role": "user", "content": "First question?"},
    {"role": "assistant", "content": "First answer.", "reasoning_content": "Reasoning one."},
    {"role": "user", "content": "Second question?"},
    {"role": "assistant", "content": "Second answer.", "reasoning_content": "Reasoning two."},
]


def test_reasoning_before_last_user_message_is_dropped(tokenizer: Any) -> None:
    assert _render(tokenizer, _TWO_QUESTIONS) == (
        "<|im_start|>user\nFirst question?<|im_end|>\n"
        "<|im_start|>assistant\nFirst answer.<|im_end|>\n"
        "<|im_start|>user\nSecond question?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nReasoning two.\n</think>\n\nSecond answer.<|im_end|>\n"
    )
    # A think block written inline in the content is treated the same way.
    inline = [{"role": m["role"], "content": f"<think>\n{m['reasoning_content']}\n</think>\n\n{m['content']}"}
              if m["role"] == "assistant" else m for m in _TWO_QUESTIONS]
    assert _render(tokenizer, inline) == _render(tokenizer, _TWO_QUESTIONS)


def test_rendering_is_not_always_prefix_stable_once_think_is_dropped(tokenizer: Any) -> None:
    up_to_answer = _render(tokenizer, _TWO_QUESTIONS[:2])
    up_to_next_question = _render(tokenizer, _TWO_QUESTIONS[:3])
    assert up_to_answer == (
        "<|im_start|>user\nFirst question?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nReasoning one.\n</think>\n\nFirst answer.<|im_end|>\n"
    )
    assert up_to_next_question == (
        "<|im_start|>user\nFirst question?<|im_end|>\n"
        "<|im_start|>assistant\nFirst answer.<|im_end|>\n"
        "<|im_start|>user\nSecond question?<|im_end|>\n"
    )
    assert not up_to_next_question.startswith(up_to_answer)  # the drift: turn 1's think block vanished
    ids_k = tokenizer.encode(up_to_answer, add_special_tokens=False)
    ids_k1 = tokenizer.encode(up_to_next_question, add_special_tokens=False)
    assert ids_k1[:len(ids_k)] != ids_k

    # Tool-response turns are not real user messages, so their think blocks survive and each rendering is a
    # prefix of the next -- except between two consecutive tool messages, where the grouped user turn's
    # closing <|im_end|>\n is replaced by the next <tool_response>.
    renders = [_render(tokenizer, _CONVERSATION[:k], tools=[_WEATHER_TOOL]) for k in range(1, len(_CONVERSATION) + 1)]
    unstable = [k for k in range(1, len(renders)) if not renders[k].startswith(renders[k - 1])]
    assert unstable == [4]  # rendering 4 messages vs 5: the two tool results
    assert renders[3].endswith("</tool_response><|im_end|>\n")
    assert renders[4].startswith(renders[3].removesuffix("<|im_end|>\n") + "\n<tool_response>\n")


def test_model_loads_back_and_generates_on_cpu(model_dir: Path, tokenizer: Any) -> None:
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    assert isinstance(model, transformers.Qwen3ForCausalLM)
    config = model.config
    assert (config.vocab_size, config.hidden_size, config.intermediate_size) == (len(tokenizer), 64, 128)
    assert (config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (
        2, 4, 2, 16)
    assert config.max_position_embeddings == 4096 and config.tie_word_embeddings
    assert (config.eos_token_id, config.pad_token_id) == (tokenizer.eos_token_id, tokenizer.pad_token_id)
    assert model.dtype == torch.float32
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()

    enc = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)
    prompt_len = enc["input_ids"].shape[1]
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=5, do_sample=True, return_dict_in_generate=True,
                             output_scores=True, output_logits=True)
    new_tokens = out.sequences.shape[1] - prompt_len
    assert 1 <= new_tokens <= 5
    assert len(out.scores) == len(out.logits) == new_tokens
    assert out.logits[0].shape == (1, len(tokenizer))
    assert all(torch.isfinite(step).all() for step in out.logits)

    # Same seed, same weights: the saved model matches a fresh build.
    fresh = build_tiny_qwen3(tokenizer, seed=0)
    with torch.no_grad():
        assert torch.equal(fresh(**enc).logits, model(**enc).logits)
