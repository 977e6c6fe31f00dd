"""``TransformersEngine``: a local Hugging Face causal LM as a token-in/token-out engine.

No server: the model samples in this process (CPU or GPU) and the logprob of each sampled token
is read from the same processed scores it was sampled from. It is the embedded default for small
models and what the offline tests run on.

Concurrent requests (the 64 rollouts of an RL step, each making several model calls) sample
together: one worker thread runs a continuous-batching decode loop. A request that arrives while
a batch is decoding is prefilled (with the other newcomers) and merged into the running batch at
the next decode step; a finished request leaves the batch at once. Each row keeps its own
sampling parameters, seed, stop ids and token budget, so what a request samples does not depend
on what else is in the batch. Newcomers prefilled together run the prefix they all share (the
system prompt and tool list of a batch of rollouts) once. A request whose caller is cancelled, or
that ``abort`` names, leaves the batch at the next step, freeing its row and its KV cache.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicCache

from rllm.engine.rollout._kv_cache import BatchCache, cache_layers, left_pad
from rllm.engine.rollout.token_engine import TokenEngine, TokenOutput, TokenSession
from rllm.errors import EngineError

logger = logging.getLogger(__name__)

_PREFILL_TOKENS = 16384
"""Most (padded) prompt tokens prefilled in one forward; more newcomers are prefilled in several."""
_MIN_SHARED_PREFIX = 16
"""Shortest prefix that newcomers prefilled together share worth a forward of its own."""


@dataclass
class BatchStats:
    """What the decode loop has done since the engine was built or ``reset()``.

    Attributes:
        prefills: Prefill forwards (each over one or more newcomers).
        prefill_rows: Requests prefilled.
        joined: Requests merged into a batch that was already decoding.
        decode_steps: Decode forwards (one token for every row of the batch).
        decode_rows: Rows over all decode steps (``mean_batch`` is this over ``decode_steps``).
        max_batch: Largest batch a decode step ran.
        sampled_tokens: Tokens sampled, the first token of each request (from its prefill) included.
        failed_forwards: Forwards that raised; their requests got an ``EngineError``.
        aborted: Requests dropped before they finished: their caller was cancelled, or ``abort`` named them.
        prefill_tokens: Prompt tokens prefilled (padding not counted).
        shared_prefix_tokens: Prompt tokens not recomputed because requests prefilled together shared them.
        prefill_seconds: Wall time of prefill forwards and their sampling.
        decode_seconds: Wall time of decode forwards and their sampling.
    """

    prefills: int = 0
    prefill_rows: int = 0
    joined: int = 0
    decode_steps: int = 0
    decode_rows: int = 0
    max_batch: int = 0
    sampled_tokens: int = 0
    failed_forwards: int = 0
    aborted: int = 0
    prefill_tokens: int = 0
    shared_prefix_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0

    @property
    def mean_batch(self) -> float:
        """Mean rows per decode step (0 before any)."""
        return self.decode_rows / self.decode_steps if self.decode_steps else 0.0

    def reset(self) -> None:
        """Zero every counter."""
        for name in self.__dataclass_fields__:
            setattr(self, name, type(getattr(self, name))())


@dataclass(eq=False)
class _Request:
    """One call of ``_generate``: what to sample, how, and where to hand the result back.

    ``aborted`` is set from any thread (the caller cancelled, or ``abort``); the worker drops the row.
    """

    prompt_ids: list[int]
    max_new_tokens: int
    stop_ids: frozenset[int]
    temperature: float
    top_p: float
    top_k: int
    generator: torch.Generator | None
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[TokenOutput]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    request_id: str = ""
    aborted: bool = False

    def add(self, token: int, logprob: float) -> bool:
        """Append a sampled token; whether the request is now finished."""
        self.token_ids.append(token)
        self.logprobs.append(logprob)
        return token in self.stop_ids or len(self.token_ids) >= self.max_new_tokens

    def output(self, *, aborted: bool = False) -> TokenOutput:
        finish = "stop" if self.token_ids and self.token_ids[-1] in self.stop_ids else "length"
        return TokenOutput(token_ids=self.token_ids, logprobs=self.logprobs,
                           finish_reason="abort" if aborted else finish)


@dataclass
class _Batch:
    """Rows decoding together.

    The cache holds every token of each row but the last sampled one (``last_tokens``, fed at the
    next step). ``attention_mask`` is 0 on padding: left of each row's tokens, and for rows
    prefilled after a shared prefix also between the prefix and the rest of the prompt. A row's
    next position id is its count of ones.
    """

    requests: list[_Request]
    cache: Any
    attention_mask: torch.Tensor
    last_tokens: torch.Tensor


def _resolve(future: asyncio.Future[TokenOutput], result: TokenOutput | BaseException) -> None:
    if future.done():  # the caller gave up (cancelled) meanwhile
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)


def _hand_back(request: _Request, result: TokenOutput | BaseException) -> None:
    """Resolve the request's future on its caller's event loop."""
    try:
        request.loop.call_soon_threadsafe(_resolve, request.future, result)
    except RuntimeError:  # the caller's loop is closed: nobody is waiting any more
        logger.debug("dropped the result of a request whose event loop is closed")


def _shared_prefix(requests: list[_Request]) -> int:
    """Length of the prefix all prompts share, leaving each prompt at least its last token."""
    first = requests[0].prompt_ids
    limit = min(len(r.prompt_ids) for r in requests) - 1
    for position in range(max(limit, 0)):
        token = first[position]
        if any(r.prompt_ids[position] != token for r in requests):
            return position
    return max(limit, 0)


def _room(requests: list[_Request]) -> int:
    """Most tokens any of ``requests`` may still add to the cache."""
    return max(r.max_new_tokens - len(r.token_ids) for r in requests)


def _merge(batch: _Batch | None, new: _Batch) -> _Batch:
    """One batch of ``batch``'s rows then ``new``'s, the shorter side left-padded to the longer."""
    if batch is None:
        if isinstance(new.cache, BatchCache):
            return new
        return _Batch(new.requests, BatchCache(cache_layers(new.cache), _room(new.requests)), new.attention_mask,
                      new.last_tokens)
    length = max(batch.attention_mask.shape[1], new.attention_mask.shape[1])
    layers = [
        (torch.cat([left_pad(k1, length, -2), left_pad(k2, length, -2)]),
         torch.cat([left_pad(v1, length, -2), left_pad(v2, length, -2)]))
        for (k1, v1), (k2, v2) in zip(cache_layers(batch.cache), cache_layers(new.cache), strict=True)
    ]
    requests = batch.requests + new.requests
    return _Batch(
        requests=requests,
        cache=BatchCache(layers, _room(requests)),
        attention_mask=torch.cat(
            [left_pad(batch.attention_mask, length, -1), left_pad(new.attention_mask, length, -1)]
        ),
        last_tokens=torch.cat([batch.last_tokens, new.last_tokens]),
    )


def _keep_rows(batch: _Batch, keep: list[int]) -> _Batch | None:
    """The batch with only the rows ``keep``, padding columns that every kept row has trimmed."""
    if not keep:
        return None
    if len(keep) == len(batch.requests):
        return batch
    requests = [batch.requests[i] for i in keep]
    index = torch.tensor(keep, device=batch.attention_mask.device)
    mask = batch.attention_mask[index]
    start = int(mask.any(dim=0).int().argmax())  # the first column any kept row uses
    if start == 0:
        batch.cache.batch_select_indices(index)
        cache = batch.cache
    else:
        cache = BatchCache([(k[index, :, start:], v[index, :, start:]) for k, v in cache_layers(batch.cache)],
                            _room(requests))
        mask = mask[:, start:]
    return _Batch(requests=requests, cache=cache, attention_mask=mask, last_tokens=batch.last_tokens[index])


def _filter_scores(scores: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Top-k then top-p (nucleus) filtering of each row of ``scores``; dropped tokens get ``-inf``.

    ``top_k`` 0 keeps every token; ``top_p`` 1 keeps every token; at least one token is kept.
    """
    ordered, order = scores.sort(dim=-1, descending=True)
    ranks = torch.arange(scores.shape[-1], device=scores.device)
    ordered = ordered.masked_fill((top_k > 0)[:, None] & (ranks[None, :] >= top_k[:, None]), float("-inf"))
    probs = ordered.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    ordered = ordered.masked_fill((top_p < 1)[:, None] & (mass_before >= top_p[:, None]), float("-inf"))
    return torch.full_like(scores, float("-inf")).scatter(-1, order, ordered)


def _sample(logits: torch.Tensor, requests: list[_Request]) -> tuple[list[int], list[float]]:
    """One token per row of ``logits`` (``[rows, vocab]``) with each row's own sampling parameters.

    Greedy rows (temperature 0) take the argmax and its raw log_softmax. Sampled rows divide by
    their temperature, filter (top-k, top-p), and draw from the result with their own generator;
    their logprob is the log_softmax of those processed scores. All in float32.
    """
    logits = logits.float()
    device = logits.device
    sampled = [i for i, r in enumerate(requests) if r.temperature > 0]
    if not sampled:
        logprobs = torch.log_softmax(logits, dim=-1)
        tokens = logits.argmax(dim=-1)
    else:
        temperature = torch.tensor([r.temperature if r.temperature > 0 else 1.0 for r in requests], device=device)
        scores = logits / temperature[:, None]
        filtered = [i for i in sampled if requests[i].top_k > 0 or requests[i].top_p < 1]
        if filtered:
            rows = torch.tensor(filtered, device=device)
            top_k = torch.tensor([requests[i].top_k for i in filtered], device=device)
            top_p = torch.tensor([requests[i].top_p for i in filtered], device=device)
            scores[rows] = _filter_scores(scores[rows], top_k, top_p)
        logprobs = torch.log_softmax(scores, dim=-1)
        tokens = logits.argmax(dim=-1)
        # Inverse-CDF sampling with one uniform per row from the row's own generator.
        rows = torch.tensor(sampled, device=device)
        cdf = logprobs[rows].exp().cumsum(dim=-1)
        uniform = torch.cat([torch.rand(1, generator=requests[i].generator, device=device) for i in sampled])
        picks = torch.searchsorted(cdf, (uniform * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1)
        tokens[rows] = picks.clamp_(max=logits.shape[-1] - 1)
    chosen = logprobs.gather(1, tokens[:, None]).squeeze(1)
    return tokens.tolist(), chosen.tolist()


class TransformersEngine(TokenEngine):
    """A local Hugging Face causal LM that samples concurrent requests together (continuous batching).

    An RL step runs many rollouts at once, each making several model calls; sampled one at a
    time they wait on each other. Here calls from any number of rollouts go to one worker
    thread, started on the first request and stopped when no request is left. At each decode
    step it prefills the requests that arrived meanwhile (batched, left-padded, a prefix they
    all share run once), merges them into the running batch, runs one forward for every row and
    retires rows that hit a stop id (the template's end-of-turn id or the tokenizer's eos) or
    their ``max_tokens``. Only one forward runs at a time, always on ``self.model`` as it is
    then: nothing derived from the weights outlives a request, so a trainer may update the
    module between rollout phases. ``max_batch_size=1`` samples one request at a time with the
    same code. Batched rows are padded, so models with sliding-window attention layers would
    see their window shifted by the padding: the engine is meant for full-attention models
    (Qwen3 and the like).

    Sampling per request: ``temperature`` (0: greedy), ``top_p``, ``top_k`` and ``seed`` (the
    request's own generator, so seeded sampling does not depend on the rest of the batch). Each
    sampled token's logprob is the float32 log_softmax of the processed scores it was drawn
    from (the raw logits for greedy). A forward that raises fails the requests in it with an
    ``EngineError``; the worker goes on with the others. ``abort`` stops requests in flight (one
    rollout's, or all of them, as verl's ``abort_all_requests`` does with a rollout server).

    Args:
        model: A loaded ``PreTrainedModel`` or a path / hub name to load with ``AutoModelForCausalLM``.
        tokenizer: The model's tokenizer, or ``None`` to load it from ``model``'s path.
        device: Where to run (``"cpu"``, ``"cuda"``); default: the model's device.
        max_batch_size: Most requests decoding together; more wait for a row to free up.
        **kwargs: As for ``TokenEngine`` (tool_parser, context_length, sampling defaults, ...).

    Attributes:
        stats: ``BatchStats`` of the decode loop (batch sizes, forwards, tokens, seconds).
        stop_ids: Token ids that end a request.
    """

    def __init__(
        self, model: Any, tokenizer: Any = None, *, device: str | None = None, max_batch_size: int = 64, **kwargs: Any
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if isinstance(model, str):
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(model)
            model = AutoModelForCausalLM.from_pretrained(model)
        if tokenizer is None:
            raise ValueError("TransformersEngine needs the tokenizer when given a loaded model")
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        if device is not None:
            model = model.to(device)
        self.model = model.eval()
        if "sliding_attention" in (getattr(model.config, "layer_types", None) or []):
            logger.warning("TransformersEngine: %s has sliding-window layers; in a padded batch their window "
                           "is shifted by the padding", type(model).__name__)
        kwargs.setdefault("context_length", getattr(model.config, "max_position_embeddings", 32768))
        super().__init__(tokenizer, **kwargs)
        self.max_batch_size = max_batch_size
        self.stats = BatchStats()
        stop_ids = {self.renderer.probe.end_of_turn_id}
        if self.tokenizer.eos_token_id is not None:
            stop_ids.add(self.tokenizer.eos_token_id)
        self.stop_ids = frozenset(stop_ids)
        pad_id = self.tokenizer.pad_token_id
        self._pad_id = int(pad_id if pad_id is not None else self.tokenizer.eos_token_id or 0)
        self._lock = threading.Lock()
        self._pending: deque[_Request] = deque()
        self._in_flight: set[_Request] = set()
        self._worker: threading.Thread | None = None
        self._last_worker: threading.Thread | None = None

    async def close(self) -> None:
        """Wait until the decode thread has finished what is in flight and stopped (it stops by itself when idle).

        Await it before the process exits: the thread is a daemon, and one still inside torch when the interpreter
        shuts down aborts the process ("terminate called without an active exception"). The engine stays usable:
        the next request starts a new thread.
        """
        worker = self._last_worker
        if worker is not None and worker.is_alive():
            await asyncio.to_thread(worker.join)

    async def _generate(
        self, prompt_ids: list[int], max_new_tokens: int, sampling: dict[str, Any], session: TokenSession
    ) -> TokenOutput:
        if max_new_tokens <= 0:
            return TokenOutput(token_ids=[], logprobs=[], finish_reason="length")
        generator = None
        if "seed" in sampling:
            generator = torch.Generator(device=self.model.device).manual_seed(int(sampling["seed"]))
        loop = asyncio.get_running_loop()
        request = _Request(
            prompt_ids=list(prompt_ids),
            max_new_tokens=max_new_tokens,
            stop_ids=self.stop_ids,
            temperature=float(sampling.get("temperature", 1.0)),
            top_p=float(sampling.get("top_p", 1.0)),
            top_k=int(sampling.get("top_k", 0) or 0),
            generator=generator,
            loop=loop,
            future=loop.create_future(),
            request_id=session.request_id,
        )
        with self._lock:
            self._pending.append(request)
            self._in_flight.add(request)
            if self._worker is None:
                self._worker = threading.Thread(target=self._serve, name="TransformersEngine-decode", daemon=True)
                self._last_worker = self._worker
                self._worker.start()
        try:
            return await request.future
        except asyncio.CancelledError:
            request.aborted = True  # nobody waits for it: the worker drops it at its next step
            raise
        finally:
            with self._lock:
                self._in_flight.discard(request)

    def abort(self, request_id: str | None = None) -> int:
        """Abort the requests in flight of the rollout ``request_id`` (its ``TokenSession.request_id``), or all.

        Each leaves the batch at the decode loop's next step, which frees its row and its KV cache;
        its caller gets the tokens sampled so far with finish reason ``abort`` (what verl expects of
        a rollout server's ``abort_all_requests``); a rollout's model call then raises
        ``GenerationAbortedError``. Safe from any thread. Returns how many were aborted.
        """
        with self._lock:
            hit = [r for r in self._in_flight if not r.aborted and (request_id is None or r.request_id == request_id)]
            for request in hit:
                request.aborted = True
        if hit:
            logger.debug("aborting %d request(s)%s", len(hit), "" if request_id is None else f" of {request_id}")
        return len(hit)

    async def sample(self, prompt_ids: list[int], max_new_tokens: int, **sampling: Any) -> TokenOutput:
        """Sample after raw ``prompt_ids`` with no session or template: what a token server's ``generate`` serves."""
        return await self._generate(list(prompt_ids), max_new_tokens, sampling, TokenSession())

    def _serve(self) -> None:
        """The worker: admit newcomers, decode one step, until no request is left."""
        batch: _Batch | None = None
        while True:
            with self._lock:
                room = self.max_batch_size - (len(batch.requests) if batch is not None else 0)
                newcomers = [self._pending.popleft() for _ in range(min(room, len(self._pending)))]
                if batch is None and not newcomers:
                    self._worker = None
                    return
            newcomers = [r for r in newcomers if not self._drop_if_aborted(r)]
            try:
                with torch.inference_mode():
                    if newcomers:
                        started = time.perf_counter()
                        batch = self._admit(batch, newcomers)
                        self.stats.prefill_seconds += time.perf_counter() - started
                    if batch is not None:
                        started = time.perf_counter()
                        batch = self._decode(batch)
                        self.stats.decode_seconds += time.perf_counter() - started
            except Exception as error:  # a bug in the loop itself: fail what is in flight, keep serving
                logger.exception("TransformersEngine decode loop failed")
                failure = EngineError(f"the decode loop failed: {type(error).__name__}: {error}", cause=repr(error))
                failure.__cause__ = error
                for request in (batch.requests if batch is not None else []) + newcomers:
                    _hand_back(request, failure)
                batch = None

    def _forward(self, requests: list[_Request], what: str, **inputs: Any) -> Any:
        """``self.model(**inputs)``; on failure the requests get an ``EngineError`` and ``None`` is returned."""
        try:
            return self.model(**inputs, use_cache=True)
        except Exception as error:
            self.stats.failed_forwards += 1
            logger.warning("TransformersEngine %s forward over %d requests failed: %s: %s",
                           what, len(requests), type(error).__name__, error)
            failure = EngineError(f"the model's {what} forward failed: {type(error).__name__}: {error}",
                                  cause=repr(error))
            failure.__cause__ = error
            for request in requests:
                _hand_back(request, failure)
            return None

    def _admit(self, batch: _Batch | None, newcomers: list[_Request]) -> _Batch | None:
        """Prefill the newcomers (sorted by length, in chunks of at most ``_PREFILL_TOKENS``) into ``batch``."""
        newcomers = sorted(newcomers, key=lambda r: len(r.prompt_ids))
        chunk: list[_Request] = []
        for request in newcomers:
            if chunk and (len(chunk) + 1) * len(request.prompt_ids) > _PREFILL_TOKENS:
                batch = self._prefill(batch, chunk)
                chunk = []
            chunk.append(request)
        return self._prefill(batch, chunk)

    def _prefill(self, batch: _Batch | None, requests: list[_Request]) -> _Batch | None:
        """Run the prompts of ``requests``, sample their first token, merge the unfinished ones into ``batch``.

        A prefix that all the prompts share (the system prompt and tool list of a batch of
        rollouts) runs once and its keys and values are copied to every row; the rest of each
        prompt is left-padded after it. Otherwise the whole prompts are left-padded.
        """
        device = self.model.device
        rows = len(requests)
        shared = _shared_prefix(requests) if rows > 1 else 0
        cache: Any = DynamicCache()
        prefix_mask = torch.ones((rows, 0), dtype=torch.long, device=device)
        if shared >= _MIN_SHARED_PREFIX:
            prefix = torch.tensor([requests[0].prompt_ids[:shared]], device=device)
            out = self._forward(requests, "prefill", input_ids=prefix, attention_mask=torch.ones_like(prefix),
                                position_ids=torch.arange(shared, device=device)[None], past_key_values=cache,
                                logits_to_keep=1)
            if out is None:
                return batch
            suffix_room = max(len(r.prompt_ids) for r in requests) - shared
            cache = BatchCache(
                [(k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1)) for k, v in cache_layers(cache)],
                suffix_room + _room(requests),
            )
            prefix_mask = torch.ones((rows, shared), dtype=torch.long, device=device)
            self.stats.shared_prefix_tokens += (rows - 1) * shared
        else:
            shared = 0
        length = max(len(r.prompt_ids) for r in requests) - shared
        input_ids = torch.full((rows, length), self._pad_id, dtype=torch.long)
        suffix_mask = torch.zeros((rows, length), dtype=torch.long)
        for row, request in enumerate(requests):
            suffix = request.prompt_ids[shared:]
            input_ids[row, length - len(suffix):] = torch.tensor(suffix)
            suffix_mask[row, length - len(suffix):] = 1
        input_ids, suffix_mask = input_ids.to(device), suffix_mask.to(device)
        position_ids = shared + (suffix_mask.cumsum(dim=1) - 1).clamp_(min=0)
        attention_mask = torch.cat([prefix_mask, suffix_mask], dim=1)
        out = self._forward(requests, "prefill", input_ids=input_ids, attention_mask=attention_mask,
                            position_ids=position_ids, past_key_values=cache, logits_to_keep=1)
        if out is None:
            return batch
        self.stats.prefills += 1
        self.stats.prefill_rows += rows
        self.stats.prefill_tokens += sum(len(r.prompt_ids) for r in requests)
        tokens, logprobs = _sample(out.logits[:, -1], requests)
        self.stats.sampled_tokens += len(tokens)
        keep = [
            row for row, request in enumerate(requests) if not self._finish_if_done(request, tokens[row], logprobs[row])
        ]
        new = _keep_rows(
            _Batch(requests=requests, cache=out.past_key_values, attention_mask=attention_mask,
                   last_tokens=torch.tensor(tokens, device=device)),
            keep,
        )
        if new is None:
            return batch
        if batch is not None:
            self.stats.joined += len(new.requests)
        return _merge(batch, new)

    def _decode(self, batch: _Batch) -> _Batch | None:
        """Feed every row its last sampled token, sample the next, retire the finished rows."""
        live = [row for row, request in enumerate(batch.requests) if not self._drop_if_aborted(request)]
        next_batch = _keep_rows(batch, live)
        if next_batch is None:
            return None
        batch = next_batch
        rows = len(batch.requests)
        position_ids = batch.attention_mask.sum(dim=1, keepdim=True)
        attention_mask = F.pad(batch.attention_mask, (0, 1), value=1)
        out = self._forward(batch.requests, "decode", input_ids=batch.last_tokens[:, None],
                            attention_mask=attention_mask, position_ids=position_ids, past_key_values=batch.cache)
        if out is None:
            return None
        self.stats.decode_steps += 1
        self.stats.decode_rows += rows
        self.stats.max_batch = max(self.stats.max_batch, rows)
        tokens, logprobs = _sample(out.logits[:, -1], batch.requests)
        self.stats.sampled_tokens += rows
        batch.attention_mask = attention_mask
        batch.last_tokens = torch.tensor(tokens, device=batch.last_tokens.device)
        keep = [
            row for row, request in enumerate(batch.requests)
            if not self._finish_if_done(request, tokens[row], logprobs[row])
        ]
        return _keep_rows(batch, keep)

    def _drop_if_aborted(self, request: _Request) -> bool:
        """Hand an aborted request (or one whose caller gave up) back with what it sampled, and say so."""
        if not (request.aborted or request.future.cancelled()):
            return False
        self.stats.aborted += 1
        _hand_back(request, request.output(aborted=True))
        return True

    @staticmethod
    def _finish_if_done(request: _Request, token: int, logprob: float) -> bool:
        """Add the token; if the request is finished, hand its output back and say so."""
        if not request.add(token, logprob):
            return False
        _hand_back(request, request.output())
        return True
