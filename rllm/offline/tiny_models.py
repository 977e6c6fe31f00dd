"""A tiny Qwen3-style tokenizer and a tiny random-init Qwen3 model, built offline in seconds.

Tests and demos of token-in/token-out rollouts need a real tokenizer with Qwen3's chat format
(``<|im_start|>`` turns, ``<tool_call>`` blocks, grouped ``<tool_response>`` turns, ``<think>``
blocks dropped on re-render) and a real ``Qwen3ForCausalLM`` that ``generate`` can run on CPU,
without downloading anything from the Hugging Face hub. The tokenizer is a byte-level BPE
trained on text that ships with this repo, so any string round-trips exactly.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import transformers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

logger = logging.getLogger(__name__)

BPE_VOCAB_SIZE = 1500
"""Size of the trained byte-level BPE vocabulary, before the special and added tokens."""

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)
"""Control tokens: single ids, dropped by ``decode(..., skip_special_tokens=True)``."""

ADDED_TOKENS = ("<tool_call>", "</tool_call>", "<think>", "</think>", "<tool_response>", "</tool_response>")
"""Markup tokens (non-special, as in Qwen3): single ids that always decode back to their text."""

# Qwen2/Qwen3's pre-tokenization split (contractions, letter runs, single digits, punctuation
# runs, newline runs, spaces); byte-level mapping happens after it, with no normalizer, so
# decoding reproduces the input bytes exactly.
_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_EXTRA_CORPUS = (
    "The quick brown fox jumps over the lazy dog.",
    "You are a helpful assistant. Answer the question using the tools when they help.",
    "What is the capital of France? The capital of France is Paris.",
    "Let me think step by step. First, I search for the answer; then I check it.",
    "The weather in Tokyo is sunny, 23 degrees Celsius, with light wind from the north.",
    "Hello! How can I help you today? Thanks, that was useful. Goodbye.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 3.14 -7 1e-5 2024-06-01",
    '{"name": "search", "arguments": {"query": "capital of France", "top_k": 3}}',
    '{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather",'
    ' "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}',
    '{"role": "assistant", "content": null, "tool_calls": [{"id": "call_0", "type": "function"}]}',
    '{"status": "success", "content": [{"text": "42"}], "error": false, "score": 0.5}',
)

CHAT_TEMPLATE = r"""{%- macro render_content(content) -%}
{%- if content is none -%}
{%- elif content is string -%}{{ content }}
{%- else -%}{%- for part in content -%}{%- if part.type == 'text' -%}{{ part.text }}{%- endif -%}{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- set has_system = messages and messages[0].role == 'system' %}
{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if has_system %}{{- render_content(messages[0].content) + '\n\n' }}{%- endif %}
{{- '# Tools\n\nThese functions are available to you; their signatures are listed between <tools> and </tools>:'
    + '\n<tools>' }}
{%- for tool in tools %}{{- '\n' + (tool | tojson) }}{%- endfor %}
{{- '\n</tools>\n\nTo call a function, write one JSON object with its name and arguments between <tool_call> and '
    + '</tool_call>, one block per call:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}'
    + '\n</tool_call><|im_end|>\n' }}
{%- elif has_system %}
{{- '<|im_start|>system\n' + render_content(messages[0].content) + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(last_query=-1) %}
{%- for message in messages %}
{%- if message.role == 'user' %}
{%- set text = render_content(message.content) %}
{%- if not (text.startswith('<tool_response>') and text.endswith('</tool_response>')) %}
{%- set ns.last_query = loop.index0 %}{%- endif %}
{%- endif %}
{%- endfor %}
{%- for message in messages %}
{%- set content = render_content(message.content) %}
{%- if message.role == 'system' %}
{%- if not loop.first %}{{- '<|im_start|>system\n' + content + '<|im_end|>\n' }}{%- endif %}
{%- elif message.role == 'assistant' %}
{%- set reasoning = none %}
{%- if message.reasoning_content is string %}
{%- set reasoning = message.reasoning_content %}
{%- elif '</think>' in content %}
{%- set reasoning = content.split('</think>')[0].split('<think>')[-1] %}
{%- set content = content.split('</think>')[-1].lstrip('\n') %}
{%- endif %}
{{- '<|im_start|>assistant\n' }}
{%- if reasoning is not none and loop.index0 > ns.last_query %}
{%- set content = content.lstrip('\n') %}
{{- '<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' }}
{%- endif %}
{{- content }}
{%- for tool_call in message.tool_calls or [] %}
{%- set call = tool_call.function if tool_call.function is defined else tool_call %}
{%- if content or not loop.first %}{{- '\n' }}{%- endif %}
{{- '<tool_call>\n{"name": "' + call.name + '", "arguments": ' }}
{%- if call.arguments is string %}{{- call.arguments }}{%- else %}{{- call.arguments | tojson }}{%- endif %}
{{- '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.first or loop.previtem.role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\n<tool_response>\n' + content + '\n</tool_response>' }}
{%- if loop.last or loop.nextitem.role != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}
{%- else %}
{{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}
{%- endif %}"""
"""Qwen3-style chat template.

Messages render as ``<|im_start|>{role}\\n{content}<|im_end|>\\n``; content may be a string or a
list of ``{"type": "text", "text": ...}`` parts. ``tools`` go into the system turn as one JSON line
each. Assistant tool calls follow the content as ``<tool_call>`` blocks. Consecutive ``tool``
messages share one ``user`` turn of ``<tool_response>`` blocks. An assistant's reasoning (its
``reasoning_content`` string, even empty, or a ``<think>...</think>`` prefix of its content) is
rendered as a think block only after the last real user message, so earlier think blocks vanish
on re-render, as in Qwen3. ``enable_thinking=False`` pre-fills an empty think block.
"""


def _repo_root() -> Path:
    """The repository root: two levels above the ``rllm`` package holding this module."""
    return Path(__file__).resolve().parents[2]


def _corpus_files(root: Path) -> list[Path]:
    """The repo's README, its manual (``docs/**/*.md``) and ``rllm/**/*.py``, sorted so training is deterministic."""
    files = sorted(p for p in (root / "rllm").rglob("*.py") if p.is_file())
    docs = sorted(p for p in (root / "docs").rglob("*.md") if p.is_file())
    readme = root / "README.md"
    return ([readme] if readme.is_file() else []) + docs + files


def _corpus(root: Path) -> Iterator[str]:
    """Training text: files that ship with the repo plus built-in sentences and JSON snippets."""
    for path in _corpus_files(root):
        yield path.read_text(encoding="utf-8", errors="replace")
    yield from _EXTRA_CORPUS


def _train_bpe() -> Tokenizer:
    """Train a byte-level BPE (no normalizer) of ``BPE_VOCAB_SIZE`` tokens on the repo's text."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(_repo_root()), trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    return tok


def build_tiny_tokenizer(out_dir: Path | None = None) -> transformers.PreTrainedTokenizerFast:
    """Build the tiny Qwen3-style tokenizer (pad ``<|endoftext|>``, eos ``<|im_end|>``, no bos).

    Saved with ``save_pretrained(out_dir)`` when ``out_dir`` is given.
    """
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=_train_bpe(),
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        additional_special_tokens=[IM_START],
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
        padding_side="left",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    if out_dir is not None:
        tokenizer.save_pretrained(out_dir)
    return tokenizer


def build_tiny_qwen3(
    tokenizer: transformers.PreTrainedTokenizerBase,
    out_dir: Path | None = None,
    seed: int = 0,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
) -> transformers.Qwen3ForCausalLM:
    """Build a small random-init float32 ``Qwen3ForCausalLM`` sized to ``tokenizer``, in eval mode.

    Default: hidden 64, 2 layers (plumbing). The MLP is 3x ``hidden_size`` wide; heads are 16-dimensional up to
    hidden 128 and 32 above, with half as many key/value heads (Qwen3's grouped-query attention). Qwen3
    tokenizers have no bos token; like Qwen3's config, bos falls back to the pad id. Saved
    together with the tokenizer when ``out_dir`` is given.
    """
    pad_id = tokenizer.pad_token_id
    bos_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else pad_id
    head_dim = 16 if hidden_size <= 128 else 32
    config = transformers.Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=128 if hidden_size == 64 else 3 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=max(hidden_size // head_dim, 1),
        num_key_value_heads=max(hidden_size // (2 * head_dim), 1),
        head_dim=head_dim,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=bos_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=pad_id,
        dtype=torch.float32,
    )
    torch.manual_seed(seed)
    # PreTrainedModel.to is wrapped with functools.wraps(torch.nn.Module.to): mypy reads the dtype as ``self``.
    model = transformers.Qwen3ForCausalLM(config).to(torch.float32).eval()  # type: ignore[arg-type]
    model.generation_config.bos_token_id = bos_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = pad_id
    if out_dir is not None:
        model.save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)
    return model


def end_turns_early(model: transformers.PreTrainedModel, tokenizer: transformers.PreTrainedTokenizerBase,
                    scale: float = 100.0) -> transformers.PreTrainedModel:
    """``model`` with its end-of-turn token's (tied) embedding scaled by ``scale``: its turns end after a few tokens.

    A random model on a real vocabulary almost never samples ``<|im_end|>``, so every turn runs to
    ``max_tokens`` and an agent on it never gives a final answer to score. Scaled by 100, a hidden-64
    model on Qwen's first 8k ranks ends its turns after about 3 to 30 tokens (a median near 10),
    sampling at temperature 1 over the whole vocabulary from an agent's prompt with a tool (by 20 most
    turns still ran to 64 tokens): random answers that finish, for offline runs whose reward must vary.
    Changed in place and returned.
    """
    eos = tokenizer.convert_tokens_to_ids(IM_END)
    with torch.no_grad():
        model.get_input_embeddings().weight[eos] *= scale
    return model


def build_tiny_model_dir(out_dir: Path) -> Path:
    """Build the tiny tokenizer and model into ``out_dir`` for ``Auto*.from_pretrained(out_dir)``."""
    start = time.perf_counter()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer()
    build_tiny_qwen3(tokenizer, out_dir=out_dir)
    logger.info("built tiny Qwen3 tokenizer+model in %s in %.2fs", out_dir, time.perf_counter() - start)
    return out_dir


RANDOM_QWEN3_DIR_NAME = "random-qwen3-v1"
"""Cache folder (under ``$RLLM_CACHE_DIR``) of ``build_random_qwen3_dir``'s default output.

Bumped when the build changes.
"""


def build_random_qwen3_dir(out_dir: Path | None = None) -> Path:
    """A small random-weight ``Qwen3ForCausalLM`` on Qwen's real tokenizer and Qwen3's real chat template.

    For plumbing runs where no trained model can be had (no hub access): the tokens, template,
    tool-call format and engine are the real ones, only the weights are random. The model stays
    small (hidden 64, 2 layers) so a rollout runs in seconds on a few CPU cores. Built once into
    ``out_dir`` (default ``$RLLM_CACHE_DIR/random-qwen3-v1``) and reused while its files are there.
    """
    from rllm.offline.chat_templates import FAMILIES
    from rllm.offline.qwen_tokenizer import cache_root

    out_dir = Path(out_dir) if out_dir is not None else cache_root() / RANDOM_QWEN3_DIR_NAME
    if (out_dir / "config.json").is_file() and (out_dir / "model.safetensors").is_file():
        return out_dir
    start = time.perf_counter()
    partial = out_dir.with_name(f"{out_dir.name}.partial")
    partial.mkdir(parents=True, exist_ok=True)
    build_tiny_qwen3(FAMILIES["qwen3"].tokenizer(), out_dir=partial)
    if out_dir.exists():
        import shutil

        shutil.rmtree(out_dir)
    partial.replace(out_dir)
    logger.info("built a random-weight Qwen3 (real tokenizer and template) in %s in %.1fs", out_dir,
                time.perf_counter() - start)
    return out_dir


class ForcedCausalLM(torch.nn.Module):
    """A causal LM whose sampled tokens are forced: ``ids`` after each prompt, then ``filler`` for ever.

    A random model never writes a tool call; this one does, through its real forward and KV cache
    (a large bias on the forced token's logit, so greedy sampling picks it and its logprob is ~0).
    Each prefill starts the script again. ``on_written`` is called from the forward that samples the
    first token after ``ids`` (e.g. to abort the request there: what was sampled is then exactly
    ``ids`` plus that token). One sequence at a time: use it with ``max_batch_size=1``.
    """

    def __init__(self, model: torch.nn.Module, ids: list[int], filler: int,
                 on_written: Callable[[], object] | None = None) -> None:
        super().__init__()
        self.model = model
        self.config = model.config
        self.ids = list(ids)
        self.filler = filler
        self.on_written = on_written
        self._prompt_length = 0

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, **kwargs: Any) -> Any:
        out = self.model(input_ids=input_ids, position_ids=position_ids, **kwargs)
        last = int(position_ids[0, -1])
        if input_ids.shape[1] > 1:  # a prefill: a new request
            self._prompt_length = last + 1
        index = last + 1 - self._prompt_length  # which sampled token this forward picks
        out.logits[:, -1, self.ids[index] if index < len(self.ids) else self.filler] += 1e4
        if index == len(self.ids) and self.on_written is not None:
            self.on_written()
        return out
