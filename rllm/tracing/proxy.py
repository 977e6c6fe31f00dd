r"""Run a LiteLLM proxy that captures every call into a ``TraceStore``.

``litellm[proxy]`` cannot share an environment with the rest of rLLM (it pins ``rich<14``,
``strands-agents-tools`` needs ``rich>=14``; newer LiteLLM wants an ``mcp`` that Strands refuses),
so the proxy runs from its own virtual environment::

    python -m rllm.tracing.proxy install            # creates .cache/litellm-venv (or $RLLM_PROXY_VENV)
    python -m rllm.tracing.proxy start --backend http://127.0.0.1:30000/v1 --served-model Qwen/Qwen3-4B \
        --db traces.db                          # serves the model as "policy" until Ctrl-C
    python -m rllm.tracing.proxy show --db traces.db [--session ID]

The proxy process imports ``rllm.tracing`` from this checkout (its parent directory goes on the
proxy's ``PYTHONPATH``); only ``rllm.types``/``rllm.tokens`` (pydantic), ``rllm.transport`` (httpx)
and standard-library modules are loaded there. ``ProxyProcess`` is the same from Python, as a context manager.

A backend's API key never reaches the disk: ``litellm_config.yaml`` names an environment variable
(``os.environ/RLLM_PROXY_BACKEND_KEY_<i>``, which LiteLLM reads) and only the LiteLLM process gets
that variable. The run directory is created 0700 and its files 0600. On the command line the key
comes from ``$OPENAI_API_KEY`` (``--backend-api-key`` works too, with a warning that ``ps`` shows it).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import venv
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import rllm
from rllm.errors import ProxyError, ServerStartError
from rllm.processes import ServerProcess, free_port, log_tail
from rllm.secret_options import add_secret_argument

logger = logging.getLogger(__name__)

LITELLM_VERSION = "1.106.2"
DEFAULT_VENV = Path(".cache") / "litellm-venv"
VENV_ENV = "RLLM_PROXY_VENV"
_MARKER = "rllm-proxy-venv.json"
_HOOKS_MODULE = "rllm_proxy_hooks"
_PACKAGE_PARENT = Path(rllm.__file__).resolve().parent.parent
_KEY_ENV = "RLLM_PROXY_BACKEND_KEY_{index}"
"""The variable that carries backend ``index``'s API key into the LiteLLM process (never the config file)."""
API_KEY_ENV = "OPENAI_API_KEY"
"""Where the command line's ``--backend-api-key`` comes from by default."""


# --------------------------------------------------------------------------- environment
def proxy_venv_path(path: str | Path | None = None) -> Path:
    """Where the proxy's environment lives: ``path``, else ``$RLLM_PROXY_VENV``, else ``.cache/litellm-venv``."""
    return Path(path or os.environ.get(VENV_ENV) or DEFAULT_VENV).expanduser().resolve()


def _venv_bin(root: Path, name: str) -> Path:
    return root / ("Scripts" if os.name == "nt" else "bin") / name


def find_proxy_venv(path: str | Path | None = None) -> Path | None:
    """The proxy environment if it is installed with the pinned LiteLLM, else ``None``."""
    root = proxy_venv_path(path)
    try:
        marker = json.loads((root / _MARKER).read_text())
    except (OSError, ValueError):
        return None
    if marker.get("litellm") != LITELLM_VERSION or not _venv_bin(root, "litellm").exists():
        return None
    return root


def _uv() -> str | None:
    """The uv beside this interpreter (the project's venv) or on ``PATH``, if any."""
    beside = Path(sys.executable).parent / ("uv.exe" if os.name == "nt" else "uv")
    return str(beside) if beside.is_file() else shutil.which("uv")


def install_proxy_venv(path: str | Path | None = None, *, quiet: bool = True) -> Path:
    """Create (or complete) the proxy environment with ``litellm[proxy]==LITELLM_VERSION``.

    Uses this interpreter's version. The installer is uv where this interpreter's environment or ``PATH`` has it
    (the set-up commands install it: a few seconds from its cache), else pip, which honours ``PIP_CACHE_DIR`` and
    ``PIP_INDEX_URL`` as usual.
    """
    root = proxy_venv_path(path)
    if find_proxy_venv(root) is not None:
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "w") as lock:  # one installer at a time (parallel test workers)
        fcntl.flock(lock, fcntl.LOCK_EX)
        if find_proxy_venv(root) is not None:
            return root
        if not _venv_bin(root, "python").exists():
            logger.info("creating the LiteLLM proxy environment at %s", root)
            venv.EnvBuilder(with_pip=True, clear=False).create(root)
        spec = f"litellm[proxy]=={LITELLM_VERSION}"
        uv = _uv()
        if uv is not None:  # uv compiles no bytecode unless asked, as pip's --no-compile
            command = [uv, "pip", "install", "--python", str(_venv_bin(root, "python")), spec]
        else:
            command = [str(_venv_bin(root, "python")), "-m", "pip", "install", "--disable-pip-version-check",
                       "--no-compile", spec]
        if quiet:
            command.insert(3, "-q")
        logger.info("installing litellm[proxy]==%s into %s (a few minutes the first time)", LITELLM_VERSION, root)
        subprocess.run(command, check=True)
        (root / _MARKER).write_text(json.dumps({"litellm": LITELLM_VERSION, "python": sys.version.split()[0]}))
    return root


# --------------------------------------------------------------------------- configuration
@dataclass
class Backend:
    """One OpenAI-compatible server behind the proxy.

    Attributes:
        api_base: Its ``/v1`` URL.
        model: The model name the server expects in requests.
        api_key: Sent as a bearer token, when set.
        kind: ``"vllm"`` (exact token ids and logprobs, streamed calls captured exactly, served by the
            ``rllm_vllm`` provider) or ``"openai"`` (any other OpenAI-compatible API, through LiteLLM's
            own ``openai/`` provider; captured from LiteLLM's success log, without token ids for streamed calls).
        model_name: The name clients use for it, when not ``ProxyConfig.model_name``.
    """

    api_base: str
    model: str
    api_key: str | None = None
    kind: Literal["vllm", "openai"] = "vllm"
    model_name: str | None = None


@dataclass
class ProxyConfig:
    """What the proxy serves and where it writes.

    Attributes:
        backends: Replicas of one model; sessions stick to one of them.
        db_path: The SQLite trace store.
        model_name: The name clients use (``model=`` in requests).
        capture: Record traces; off gives a bare proxy (the benchmark's baseline).
        token_ids: Ask vLLM backends for ``return_token_ids``.
        logprobs: Ask vLLM backends for the sampled tokens' logprobs.
        sticky: Route each session to one backend.
        num_retries: LiteLLM router retries per request.
        timeout: Seconds per upstream call.
    """

    backends: list[Backend]
    db_path: str | Path
    model_name: str = "policy"
    capture: bool = True
    token_ids: bool = True
    logprobs: bool = True
    sticky: bool = True
    num_retries: int = 2
    timeout: float = 600.0
    extra_litellm_settings: dict[str, Any] = field(default_factory=dict)


def _model_entry(config: ProxyConfig, index: int, backend: Backend) -> dict[str, Any]:
    prefix = "rllm_vllm" if backend.kind == "vllm" else "openai"
    # A reference LiteLLM resolves from its own environment (``backend_key_env``), never the key itself.
    api_key = f"os.environ/{_KEY_ENV.format(index=index)}" if backend.api_key else "EMPTY"
    params: dict[str, Any] = {"model": f"{prefix}/{backend.model}", "api_base": backend.api_base,
                              "api_key": api_key, "timeout": config.timeout}
    return {"model_name": backend.model_name or config.model_name, "litellm_params": params,
            "model_info": {"id": f"backend-{index}"}}


def backend_key_env(config: ProxyConfig) -> dict[str, str]:
    """The environment variables that carry the backends' API keys to the LiteLLM process."""
    return {_KEY_ENV.format(index=i): b.api_key for i, b in enumerate(config.backends) if b.api_key}


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (0600), also when the file already exists."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)


def write_config(config: ProxyConfig, run_dir: str | Path) -> Path:
    """Write ``litellm_config.yaml`` and the hooks module it loads into ``run_dir``; return the config path.

    The file is JSON, which YAML reads as is. It holds no API key (see ``backend_key_env``); the
    directories it creates are 0700 and the files 0600.
    """
    if not config.backends:
        raise ValueError("ProxyConfig needs at least one backend")
    run_dir = Path(run_dir)
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    settings: dict[str, Any] = {
        "drop_params": False,
        "num_retries": config.num_retries,
        "request_timeout": config.timeout,
        "custom_provider_map": [{"provider": "rllm_vllm", "custom_handler": f"{_HOOKS_MODULE}.backend"}],
        **config.extra_litellm_settings,
    }
    if config.capture:
        settings["callbacks"] = [f"{_HOOKS_MODULE}.capture"]
    document = {
        "model_list": [_model_entry(config, i, b) for i, b in enumerate(config.backends)],
        "litellm_settings": settings,
        "router_settings": {"routing_strategy": "simple-shuffle", "num_retries": config.num_retries},
    }
    hooks = {"db_path": str(Path(config.db_path).resolve()), "capture": config.capture,
             "token_ids": config.token_ids, "logprobs": config.logprobs, "sticky": config.sticky}
    # Not next to the config: LiteLLM would execute a module found there once per reference (two stores).
    # From ``hooks/`` on PYTHONPATH it is imported once and shared by the callback and the provider.
    (run_dir / "hooks").mkdir(mode=0o700, exist_ok=True)
    _write_private(run_dir / "hooks" / f"{_HOOKS_MODULE}.py", _HOOKS_TEMPLATE.format(settings=json.dumps(hooks)))
    path = run_dir / "litellm_config.yaml"
    _write_private(path, json.dumps(document, indent=2))
    return path


_HOOKS_TEMPLATE = '''"""Generated by rllm.tracing.proxy: the objects litellm_config.yaml names."""
import atexit
import json
import logging
import sys

from rllm.tracing.backend import TokenIdBackend
from rllm.tracing.store import TraceStore

_handler = logging.StreamHandler(sys.stderr)
_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
_rllm_logger = logging.getLogger("rllm")
_rllm_logger.addHandler(_handler)
_rllm_logger.setLevel(logging.INFO)
_rllm_logger.propagate = False
# The store's writer thread must get the GIL quickly while the event loop runs LiteLLM's logging
# code, or each call waits up to the default 5 ms switch interval for its commit (measured: the
# capture's added latency drops from ~1.3 ms to ~0.3 ms per call).
sys.setswitchinterval(0.0002)
SETTINGS = json.loads({settings!r})
store = TraceStore(SETTINGS["db_path"]) if SETTINGS["capture"] else None
backend = TokenIdBackend(store, token_ids=SETTINGS["token_ids"], logprobs=SETTINGS["logprobs"])
if store is not None:
    from rllm.tracing.callback import TraceCapture

    capture = TraceCapture(store, sticky=SETTINGS["sticky"])
    atexit.register(store.close)
logging.getLogger("rllm.tracing").info("rllm capture %s, trace store %s", "on" if store else "off", SETTINGS["db_path"])
'''


# --------------------------------------------------------------------------- process
class ProxyProcess:
    """A LiteLLM proxy subprocess on 127.0.0.1; ``with ProxyProcess(config) as proxy: proxy.base_url``.

    Args:
        config: Backends, store and capture settings.
        run_dir: Where the config, hooks module and ``proxy.log`` go (a temporary directory if unset).
        port: Fixed port; a free one is picked when unset (and kept across ``restart``).
        venv: The proxy environment (see ``proxy_venv_path``); it must be installed.
        startup_timeout: Seconds to wait for the proxy to answer.
    """

    def __init__(self, config: ProxyConfig, *, run_dir: str | Path | None = None, port: int | None = None,
                 venv: str | Path | None = None, startup_timeout: float = 180.0) -> None:
        self.config = config
        self._own_run_dir = run_dir is None
        self.run_dir = Path(run_dir or tempfile.mkdtemp(prefix="rllm-proxy-"))
        self._fixed_port = port is not None
        self.port = port or free_port()
        self.api_key = "sk-rllm-" + secrets.token_hex(24)
        self.startup_timeout = startup_timeout
        self._venv = venv
        self._server: ServerProcess | None = None

    @property
    def base_url(self) -> str:
        """The OpenAI ``base_url`` for clients."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def log_path(self) -> Path:
        return self.run_dir / "proxy.log"

    @property
    def running(self) -> bool:
        return self._server is not None and self._server.running

    def start(self) -> ProxyProcess:
        """Write the config, launch ``litellm`` and return once it answers health checks."""
        if self.running:
            raise ProxyError("the proxy is already running")
        for attempt in range(3):
            logged = self.log_path.stat().st_size if self.log_path.exists() else 0
            try:
                return self._start()
            except ProxyError:
                # Another process took the picked port between picking and binding: pick another. The
                # bind error sits above uvicorn's long traceback, so this attempt's whole log is read.
                if self._fixed_port or attempt == 2 or not self._bind_failed_since(logged):
                    raise
                logger.warning("port %d was taken before the proxy bound it; trying another", self.port)
                self.port = free_port()
        raise AssertionError("unreachable")

    def _bind_failed_since(self, offset: int) -> bool:
        """Whether the log, from byte ``offset`` on (one start attempt), says the port was already in use."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(offset)
                return b"address already in use" in log.read().lower()
        except OSError:
            return False

    def _start(self) -> ProxyProcess:
        root = find_proxy_venv(self._venv)
        if root is None:
            raise ProxyError(f"no LiteLLM proxy environment at {proxy_venv_path(self._venv)}; create it with "
                             "`python -m rllm.tracing.proxy install` (or set $RLLM_PROXY_VENV)")
        config_path = write_config(self.config, self.run_dir)
        env = {**os.environ, **backend_key_env(self.config),
               "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_MASTER_KEY": self.api_key,
               "LITELLM_TELEMETRY": "False", "PYTHONUNBUFFERED": "1",
               "LITELLM_LOG": os.environ.get("LITELLM_LOG", "WARNING"),
               "PYTHONPATH": os.pathsep.join([str(self.run_dir / "hooks"), str(_PACKAGE_PARENT)])}
        env.pop("VIRTUAL_ENV", None)
        # The environment is rllm's own and installed without bytecode (``--no-compile``): LiteLLM's first start
        # caches what it imports there, so every later start imports in half the time (about 6.7 s against 13 s
        # on 2 cores), even where the caller's environment says not to write bytecode (PYTHONDONTWRITEBYTECODE).
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        command = [str(_venv_bin(root, "litellm")), "--config", str(config_path), "--host", "127.0.0.1",
                   "--port", str(self.port), "--num_workers", "1"]
        logger.info("starting the LiteLLM proxy from its own environment %s on %s (log: %s)", root, self.base_url,
                    self.log_path)
        # The log is the owner's only, like the config: a failing upstream call may be logged with its headers.
        os.close(os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
        self._server = ServerProcess(command, self.log_path, env=env, cwd=self.run_dir, append=True)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        assert self._server is not None
        try:
            self._server.wait_ready(f"http://127.0.0.1:{self.port}/health/readiness", self.startup_timeout,
                                    interval=0.25)
        except ServerStartError as error:
            if error.returncode is not None:
                raise ProxyError(f"the LiteLLM proxy exited during start-up; see {self.log_path}:\n"
                                 f"{self._log_tail()}") from None
            raise ProxyError(f"the LiteLLM proxy did not answer within {self.startup_timeout} s; "
                             f"see {self.log_path}") from None

    def _log_tail(self, lines: int = 30) -> str:
        return log_tail(self.log_path, lines)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the proxy (SIGTERM, then SIGKILL after ``timeout``); traces it acknowledged are already stored."""
        server, self._server = self._server, None
        if server is not None:
            server.stop(timeout)

    def restart(self) -> ProxyProcess:
        """Stop and start again on the same port, key and store."""
        self.stop()
        return self.start()

    def close(self) -> None:
        """Stop, and remove the run directory if this object created it."""
        self.stop()
        if self._own_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def __enter__(self) -> ProxyProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- command line
def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m rllm.tracing.proxy", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    install = sub.add_parser("install", help="create the proxy's virtual environment")
    install.add_argument("--venv", help=f"where (default ${VENV_ENV} or {DEFAULT_VENV})")
    start = sub.add_parser("start", help="run the proxy in the foreground until interrupted")
    start.add_argument("--backend", action="append", required=True, help="a backend's /v1 URL (repeat for replicas)")
    start.add_argument("--served-model", required=True, help="the model name the backends expect")
    start.add_argument("--kind", choices=["vllm", "openai"], default="vllm")
    add_secret_argument(start, "--backend-api-key", env=API_KEY_ENV, help="the backends' API key")
    start.add_argument("--model-name", default="policy", help="the name clients use")
    start.add_argument("--db", required=True, help="SQLite trace store")
    start.add_argument("--port", type=int)
    start.add_argument("--run-dir")
    start.add_argument("--venv")
    show = sub.add_parser("show", help="print the sessions of a trace store, or one session's traces")
    show.add_argument("--db", required=True)
    show.add_argument("--session")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; exit status 2 when the proxy cannot start."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = _parse_args(argv)
    if args.command == "install":
        root = install_proxy_venv(args.venv, quiet=False)
        print(f"LiteLLM proxy environment ready: {root}")
        return 0
    if args.command == "show":
        from rllm.tracing.store import TraceStore
        from rllm.tracing.trajectory import trajectory_from_traces

        with TraceStore(args.db) as store:
            if args.session is None:
                for summary in store.sessions():
                    print(f"{summary.session_id}\t{summary.num_traces} calls\t{summary.name or ''}")
            else:
                result = trajectory_from_traces(store.get_session(args.session))
                print(result.trajectory.model_dump_json(indent=2))
                print(json.dumps(result.report(), indent=2))
        return 0
    config = ProxyConfig(backends=[Backend(url, args.served_model, args.backend_api_key, args.kind)
                                   for url in args.backend], db_path=args.db, model_name=args.model_name)
    proxy = ProxyProcess(config, run_dir=args.run_dir, port=args.port, venv=args.venv)
    # SIGTERM (`kill PID`) takes the same way out as Ctrl-C, so the LiteLLM process group, which runs in
    # its own session, is stopped with this process instead of being left orphaned on its port.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        proxy.start()
    except ProxyError as error:
        proxy.close()
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        print(f"proxy ready: base_url={proxy.base_url} api_key={proxy.api_key} model={config.model_name} "
              f"pid={os.getpid()} (stop: Ctrl-C or kill {os.getpid()})", flush=True)
        while proxy.running:
            time.sleep(1.0)
    except KeyboardInterrupt:
        logger.info("stopping the proxy")
    finally:
        proxy.close()
    return 0


def _interrupt(signum: int, frame: object) -> None:
    """Turn the first SIGTERM into KeyboardInterrupt; ignore repeats so they cannot cut the stop short."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
