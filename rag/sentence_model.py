"""A sentence-transformers model folder run on plain transformers: its transformer, pooling and normalisation.

``modules.json`` names the folder's stages, ``sentence_bert_config.json`` its token limit and the pooling
folder's ``config.json`` how token vectors become one; the stages the retrieval encoders in use have
(MiniLM, E5, BGE, GTE: ``Transformer``, ``Pooling``, ``Normalize``) run here as sentence-transformers runs
them, and any other stage is refused by name. Reading the folder instead of importing sentence-transformers
keeps scikit-learn and SciPy out of the install (``[tool.uv]`` in ``pyproject.toml``): transformers imports both
wherever they are installed, in every process that loads it (each of verl's workers), about 1.3 CPU-seconds a
process.

``tests/rag/test_build_index.py`` checks the embeddings against sentence-transformers' own, recorded by
``tests/rag/data/minilm_reference.py``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rag.errors import EncoderLayoutError

logger = logging.getLogger(__name__)

# sentence-transformers' pooling flags (its older config form), in the order it concatenates the modes.
_POOLING_FLAGS = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                  "pooling_mode_mean_tokens": "mean", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                  "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}
_POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "lasttoken")
# The stages rag runs, in the order a folder's modules.json must list them (the last one optional).
_STAGES = ("Transformer", "Pooling", "Normalize")
# Weights a model folder may carry for other runtimes; a hub download skips them.
_OTHER_RUNTIMES = ["onnx/*", "openvino/*", "*.onnx", "*.h5", "*.msgpack", "*.ot", "tf_model*", "flax_model*",
                   "rust_model*"]


@dataclass(frozen=True)
class SentenceLayout:
    """What a sentence-transformers folder says about its stages.

    Attributes:
        transformer_dir: The folder of the transformer and its tokenizer.
        pooling: The pooling modes, concatenated in this order (``cls``, ``max``, ``mean``, ...).
        normalize: Whether the folder ends with a ``Normalize`` stage (L2, always applied).
        max_seq_length: The token limit the folder gives, if any.
        do_lower_case: Lower-case texts before tokenizing.
    """

    transformer_dir: Path
    pooling: tuple[str, ...] = ("mean",)
    normalize: bool = False
    max_seq_length: int | None = None
    do_lower_case: bool = False


def read_layout(folder: Path) -> SentenceLayout:
    """The stages of ``folder``; a folder without ``modules.json`` is a plain transformer, mean-pooled.

    Raises ``EncoderLayoutError`` for any stage but one ``Transformer``, then one ``Pooling``, then an
    optional ``Normalize``.
    """
    modules_file = folder / "modules.json"
    if not modules_file.is_file():  # sentence-transformers' own fallback for a plain transformers folder
        return SentenceLayout(folder, **_transformer_settings(folder))
    paths = []
    for index, module in enumerate(json.loads(modules_file.read_text(encoding="utf-8"))):
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        if index >= len(_STAGES) or kind != _STAGES[index]:
            raise EncoderLayoutError(
                f"encoder folder {folder} has a {module.get('type')!r} stage where rag runs only Transformer, "
                f"Pooling and an optional Normalize, in that order; embed with sentence-transformers and build "
                f"the index from those vectors instead")
        paths.append(folder / module.get("path", ""))
    if len(paths) < 2:
        raise EncoderLayoutError(f"encoder folder {folder} has no Pooling stage after its Transformer")
    transformer, pooling = paths[:2]
    return SentenceLayout(transformer, pooling=_pooling_modes(pooling / "config.json"), normalize=len(paths) == 3,
                          **_transformer_settings(transformer))


def _transformer_settings(folder: Path) -> dict[str, Any]:
    path = folder / "sentence_bert_config.json"
    config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    return {"max_seq_length": config.get("max_seq_length"), "do_lower_case": bool(config.get("do_lower_case"))}


def _pooling_modes(path: Path) -> tuple[str, ...]:
    config = json.loads(path.read_text(encoding="utf-8"))
    if "pooling_mode" in config:
        mode = config["pooling_mode"]
        modes = (mode,) if isinstance(mode, str) else tuple(mode)
    else:
        modes = tuple(mode for key, mode in _POOLING_FLAGS.items() if config.get(key)) or ("mean",)
    unknown = [m for m in modes if m not in _POOLING_MODES]
    if unknown:
        raise EncoderLayoutError(f"{path} pools by {unknown}; rag pools by {', '.join(_POOLING_MODES)}")
    if not config.get("include_prompt", True):
        logger.info("%s excludes prompts from pooling; rag's prefixes are part of the text and are pooled", path)
    return modes


def fetch_folder(name_or_path: str) -> Path:
    """A local folder as it is, a hub name as the folder of its snapshot (an ``OSError`` offline)."""
    path = Path(name_or_path)
    if path.is_dir():
        return path
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(name_or_path, ignore_patterns=_OTHER_RUNTIMES))


class SentenceModel(torch.nn.Module):
    """The folder's transformer, pooling and normalisation as one module, from token tensors to embeddings.

    ``forward`` takes the tensors named by ``input_names`` in that order, the form ``torch.jit.trace`` needs.
    ``tokenizer`` is kept beside it (a fast tokenizer is not safe to share between threads: each copy of the
    module carries its own).
    """

    def __init__(self, transformer: Any, tokenizer: Any, layout: SentenceLayout, *, normalize: bool,
                 max_seq_length: int | None = None) -> None:
        super().__init__()
        self.transformer = transformer
        self.tokenizer = tokenizer
        self.pooling = layout.pooling
        self.normalize = normalize or layout.normalize
        self.do_lower_case = layout.do_lower_case
        limits = [n for n in (getattr(transformer.config, "max_position_embeddings", None),
                              tokenizer.model_max_length) if n]
        self.max_seq_length = int(max_seq_length or layout.max_seq_length or min(limits))
        self.dim = len(self.pooling) * int(transformer.config.hidden_size)
        self.input_names = [name for name in tokenizer(["a"], return_tensors="pt")
                            if name in ("input_ids", "attention_mask", "token_type_ids")]

    @classmethod
    def load(cls, folder: Path, *, device: str, normalize: bool, max_seq_length: int | None = None) -> SentenceModel:
        """The model of a sentence-transformers (or plain transformers) folder, in eval mode on ``device``."""
        from transformers import AutoModel, AutoTokenizer

        layout = read_layout(folder)
        transformer = AutoModel.from_pretrained(layout.transformer_dir)
        tokenizer = AutoTokenizer.from_pretrained(layout.transformer_dir)
        return cls(transformer, tokenizer, layout, normalize=normalize,
                   max_seq_length=max_seq_length).to(device).eval()

    def tokenize(self, texts: list[str]) -> dict[str, torch.Tensor]:
        """Padded to the longest text, cut at ``max_seq_length``, as sentence-transformers tokenizes."""
        if self.do_lower_case:
            texts = [text.lower() for text in texts]
        features = self.tokenizer(texts, padding=True, truncation="longest_first", max_length=self.max_seq_length,
                                  return_tensors="pt")
        return {name: features[name] for name in self.input_names}

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        features = dict(zip(self.input_names, tensors, strict=True))
        tokens = self.transformer(**features).last_hidden_state
        mask = features.get("attention_mask")
        if mask is None:
            mask = torch.ones(tokens.shape[:-1], dtype=torch.int64, device=tokens.device)
        embedding = torch.cat([_pool(mode, tokens, mask) for mode in self.pooling], dim=-1)
        return torch.nn.functional.normalize(embedding, p=2, dim=1) if self.normalize else embedding


def _pool(mode: str, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """One pooling mode of sentence-transformers' ``Pooling`` over padded token vectors."""
    weights = mask.unsqueeze(-1).to(tokens.dtype)
    if mode == "cls":  # the first unmasked token (left padding too)
        first = mask.to(torch.int32).argmax(dim=1)
        return tokens[torch.arange(tokens.shape[0], device=tokens.device), first]
    if mode == "max":
        return tokens.masked_fill(weights == 0, float("-inf")).max(dim=1).values
    if mode == "lasttoken":  # the last unmasked token (right padding too)
        seen = mask.to(torch.int32).flip(1).argmax(dim=1)
        last = tokens.shape[1] - 1 - seen
        return (tokens * weights)[torch.arange(tokens.shape[0], device=tokens.device), last]
    total = (tokens * weights).sum(dim=1, dtype=torch.float32)
    count = torch.clamp(weights.sum(dim=1, dtype=torch.float32), min=1e-9)
    return (total / (count if mode == "mean" else torch.sqrt(count))).to(tokens.dtype)
