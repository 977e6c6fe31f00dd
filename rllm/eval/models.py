"""The model an evaluation runs, from its command-line arguments; shared by the search and GAIA evals.

One of:
    --scripted                         an embedded scripted model (each eval brings its own script)
    --base-url URL --model NAME        any OpenAI-compatible endpoint (add --vllm for token ids and logprobs)
    --model PATH_OR_HUB_NAME           a local Hugging Face model run in process (``TransformersEngine``)

``choose_model`` settles everything that can fail before a run starts (a local model's directory,
the endpoint answering); ``open_engine`` then builds the rollout engine. The endpoint's key comes
from ``$OPENAI_API_KEY``, the variable OpenAI's own client reads (``--api-key`` works too, with a
warning that ``ps`` shows it).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx
from rich.console import Console

from rllm.engine.rollout import OpenAIEngine
from rllm.errors import ModelUnreachableError, SetupError
from rllm.offline.scripted_server import Script, ScriptedOpenAIServer
from rllm.secret_options import add_secret_argument

DEFAULT_MODEL = "Qwen/Qwen3-0.6B"
"""The search eval's and the quickstart's model when none is named."""
API_KEY_ENV = "OPENAI_API_KEY"
"""Where ``--api-key`` comes from by default: the variable OpenAI's client reads."""
RANDOM_WEIGHTS_LABEL = "random-weight Qwen3 (plumbing only: random weights, real Qwen tokenizer and chat template)"
TINY_MODEL_HINT = (
    "python -c \"from pathlib import Path; from rllm.offline.tiny_models import build_tiny_model_dir; "
    "build_tiny_model_dir(Path('/tmp/tiny-qwen3'))\""
)


@dataclass(frozen=True)
class ModelChoice:
    """The model the arguments ask for, checked before anything starts.

    Attributes:
        kind: ``"scripted"``, ``"endpoint"`` (an OpenAI-compatible server) or ``"local"`` (run in process).
        name: The name reports show: ``"scripted"``, the served model name, or the local model as named.
        path: A local model's directory.
        random_weights: The default model could not be had; ``path`` is a small random-weight Qwen3 instead.
    """

    kind: Literal["scripted", "endpoint", "local"]
    name: str
    path: str | None = None
    random_weights: bool = False


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0].removeprefix("Got: ")


# ------------------------------------------------------------------------------------ arguments
def add_model_arguments(parser: argparse.ArgumentParser, *, max_tokens: int, temperature: float | None = None,
                        default_model: str | None = DEFAULT_MODEL) -> None:
    """Add the model and sampling options; ``default_model=None`` makes naming a model mandatory."""
    title = (f"model (default: {default_model} run locally with transformers)" if default_model else
             "model (one of --model PATH_OR_HUB_NAME, --base-url URL --model NAME, --scripted)")
    model = parser.add_argument_group(title)
    model.add_argument("--model", default=None,
                       help="local model directory or hub name (run in process); with --base-url: the served name")
    model.add_argument("--base-url", default=None, help="an OpenAI-compatible endpoint, e.g. http://127.0.0.1:30000/v1")
    add_secret_argument(model, "--api-key", env=API_KEY_ENV, default="EMPTY", help="the endpoint's API key")
    model.add_argument("--vllm", action="store_true", help="ask a vLLM endpoint for token ids and logprobs")
    model.add_argument("--scripted", action="store_true", help="an embedded scripted model instead (offline demo)")
    model.add_argument("--device", default=None, help="for a local model: cpu or cuda (default: cuda if available)")
    model.add_argument("--thinking", action="store_true", help="let Qwen3 think (<think>) before answering")
    model.add_argument("--temperature", type=float, default=temperature,
                       help="sampling temperature" + (f" (default {temperature})" if temperature is not None else
                                                      " (default: 0 for one rollout, 0.7 for several)"))
    model.add_argument("--max-tokens", type=int, default=max_tokens, help="tokens per model turn")
    model.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request to --base-url")
    model.add_argument("--max-retries", type=int, default=5,
                       help="retries of one request to --base-url (429, 5xx, network)")
    parser.set_defaults(default_model=default_model)


def url_problem(url: str) -> str | None:
    """Why ``url`` is not an http(s) URL with a host, or None when it is."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        return f"{url!r} is not an http:// or https:// URL with a host (e.g. http://127.0.0.1:30000/v1)"
    return None


def check_model_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Reject contradictory or missing model options (``parser.error``: exit status 2 with the usage)."""
    if args.scripted and (args.base_url or args.model):
        parser.error("--scripted replaces the model; drop --model / --base-url")
    if args.base_url and not args.model:
        parser.error("--base-url needs --model NAME (the model name the endpoint serves)")
    if not (args.scripted or args.model or args.default_model):
        parser.error("name the model: --model PATH_OR_HUB_NAME (run locally), --base-url URL --model NAME "
                     "(an OpenAI-compatible endpoint), or --scripted (the offline demo)")
    problem = args.base_url and url_problem(args.base_url)
    if problem:
        parser.error(f"--base-url: {problem}")


# ------------------------------------------------------------------------------------ resolution
def resolve_model(name_or_path: str) -> str:
    """A local directory for ``name_or_path``: the directory itself, or the hub snapshot (downloaded once).

    Raises ``ModelUnreachableError`` with a one-paragraph explanation when the hub cannot be reached
    and the model is not cached, and ``SetupError`` when the name or directory does not exist.
    """
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return str(path)
    if name_or_path.startswith(("/", ".", "~")) or name_or_path.count("/") > 1:
        raise SetupError(f"--model {name_or_path}: no such directory. Give a local model directory (config.json, "
                         f"weights and tokenizer), or a Hugging Face hub name such as {DEFAULT_MODEL}.")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        return snapshot_download(name_or_path, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model",
                                                               "*.jinja", "tokenizer*"])
    except (LocalEntryNotFoundError, httpx.HTTPError, ConnectionError) as error:
        from huggingface_hub import constants

        if constants.HF_HUB_OFFLINE:
            why = "hub access is switched off (HF_HUB_OFFLINE=1)"
        else:
            why = f"the Hugging Face hub cannot be reached from this machine ({_first_line(error)})"
        raise ModelUnreachableError(
            f"The model {name_or_path} could not be fetched: {why} and the model is not in the local cache "
            f"({os.environ.get('HF_HOME', '~/.cache/huggingface')}). Pass a local model directory with "
            f"--model PATH (a directory with config.json, the weights and the tokenizer, e.g. one saved by "
            f"save_pretrained or downloaded elsewhere with `hf download {name_or_path}`), or an "
            f"OpenAI-compatible endpoint with --base-url URL --model NAME, or add --scripted to watch the loop "
            f"with a scripted model. A tiny random model for a smoke test: {TINY_MODEL_HINT}",
            why,
        ) from None
    except (RepositoryNotFoundError, HFValidationError) as error:
        raise SetupError(f"--model {name_or_path}: not a model on the Hugging Face hub ({_first_line(error)})."
                         f" Give a hub name such as {DEFAULT_MODEL} or a local directory.") from None


def check_reachable(url: str, path: str, what: str, *, headers: dict[str, str] | None = None,
                    timeout: float = 10.0) -> None:
    """Raise ``SetupError`` when nothing answers at ``url`` (any HTTP status counts as an answer).

    Checked before any work starts, so a wrong or dead URL costs one line and a few seconds
    instead of every rollout's retries.
    """
    try:
        httpx.get(url.rstrip("/") + path, headers=headers, timeout=timeout)
    except httpx.HTTPError as error:
        raise SetupError(f"{what} at {url} is unreachable ({type(error).__name__}: {error or 'no answer'}); "
                         f"start it or fix the URL") from error


def choose_model(args: argparse.Namespace, console: Console) -> ModelChoice:
    """Settle the model before anything starts: a local model's directory, or the endpoint answering.

    The default model (never one named with ``--model``) that cannot be fetched is replaced, with
    one line saying so, by a small random-weight Qwen3 on Qwen's real tokenizer and chat template.
    """
    if args.scripted:
        return ModelChoice("scripted", "scripted")
    if args.base_url:
        check_reachable(args.base_url, "/models", "model endpoint (--base-url)",
                        headers={"Authorization": f"Bearer {args.api_key}"})
        return ModelChoice("endpoint", args.model)
    name = args.model or args.default_model
    try:
        return ModelChoice("local", name, resolve_model(name))
    except ModelUnreachableError as error:
        if args.model:
            raise
        from rllm.offline.tiny_models import build_random_qwen3_dir

        console.print(f"{name} cannot be fetched: {error.why}. Running the same pipeline on a small "
                      f"{RANDOM_WEIGHTS_LABEL}.", highlight=False)
        return ModelChoice("local", name, str(build_random_qwen3_dir()), random_weights=True)


@contextlib.contextmanager
def open_engine(args: argparse.Namespace, choice: ModelChoice, scripted: Script,
                scripted_label: str = "scripted") -> Iterator[tuple[Any, str]]:
    """The rollout engine ``choice`` asks for, and a one-line description of it, for a run's duration.

    ``scripted`` is the script of the embedded OpenAI-compatible server ``--scripted`` runs.
    """
    sampling = {"temperature": args.temperature, "max_tokens": args.max_tokens}
    if choice.kind == "scripted":
        with ScriptedOpenAIServer(scripted, model=choice.name) as server:
            yield OpenAIEngine(choice.name, server.base_url, max_retries=2, **sampling), scripted_label
        return
    if choice.kind == "endpoint":
        yield (OpenAIEngine(args.model, args.base_url, args.api_key, return_token_ids=args.vllm,
                            timeout=args.request_timeout, max_retries=args.max_retries, **sampling),
               f"{args.model} at {args.base_url}" + (" (vLLM token ids)" if args.vllm else ""))
        return
    from rllm.engine.rollout.transformers_engine import TransformersEngine

    assert choice.path is not None
    device = args.device
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        engine = TransformersEngine(choice.path, device=device, tool_parser="hermes",
                                    chat_template_kwargs={"enable_thinking": args.thinking}, **sampling)
    except (OSError, ValueError) as error:
        raise SetupError(f"--model {choice.name}: could not load a causal LM and its tokenizer from {choice.path} "
                         f"({_first_line(error)}).") from None
    label = RANDOM_WEIGHTS_LABEL if choice.random_weights else choice.name
    yield engine, f"{label} (transformers, {device})"
