"""Traced OpenAI clients: every request carries the current session id in one header.

The clients are plain ``openai.AsyncOpenAI`` / ``openai.OpenAI`` objects whose httpx client has a
request hook that sets ``x-rllm-session`` from ``rllm.tracing.session.current_session()`` at send
time (so retries and streamed calls are tagged too). Nothing else is added: no task data in the
URL, the headers or the body. Pass one as ``client=`` to Strands' ``OpenAIModel`` or
``rllm.integrations.strands.NonStreamingOpenAIModel``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

import httpx
import openai

from rllm.tracing.session import SESSION_HEADER, current_session
from rllm.transport import open_openai_client, open_openai_sync_client

logger = logging.getLogger(__name__)


def session_headers() -> dict[str, str]:
    """The header to send with a request made now: the current session id, or nothing."""
    ctx = current_session()
    return {SESSION_HEADER: ctx.id} if ctx is not None else {}


def _tag(request: httpx.Request) -> None:
    ctx = current_session()
    if ctx is not None:
        request.headers[SESSION_HEADER] = ctx.id
    elif SESSION_HEADER not in request.headers:  # an explicit header (extra_headers=...) is left alone
        logger.warning("request to %s made outside any rllm session; the proxy stores it under 'no-session'",
                       request.url.path)


async def _atag(request: httpx.Request) -> None:
    _tag(request)


class _HookedClient(Protocol):
    """An httpx client (``rllm.transport.open_openai_client``, or the caller's own): request hooks to read and set."""

    @property
    def event_hooks(self) -> dict[str, list[Callable[..., Any]]]: ...

    @event_hooks.setter
    def event_hooks(self, event_hooks: dict[str, list[Callable[..., Any]]]) -> None: ...


def _with_hook(client: _HookedClient, hook: Callable[..., Any]) -> None:
    hooks = client.event_hooks
    hooks["request"] = [*hooks.get("request", []), hook]
    client.event_hooks = hooks


def get_chat_client_async(base_url: str, api_key: str | None = None, *,
                          http_client: httpx.AsyncClient | None = None, **kwargs: Any) -> openai.AsyncOpenAI:
    """An ``openai.AsyncOpenAI`` for ``base_url`` (e.g. the proxy's ``/v1``) that tags each request.

    Args:
        base_url: OpenAI-compatible base URL.
        api_key: The proxy's key (``ProxyProcess.api_key``).
        http_client: Your own httpx client; the tagging hook is added to its request hooks. Default:
            ``rllm.transport.open_openai_client`` (openai's own timeouts and pool).
        **kwargs: Passed to ``openai.AsyncOpenAI`` (``max_retries``, ``timeout``...).
    """
    if http_client is None:  # openai's defaults, built where rllm builds its HTTP clients
        http_client = open_openai_client()
    _with_hook(http_client, _atag)
    # Newer openai types http_client as its httpx2 client but takes an httpx one too (a "legacy" client).
    return openai.AsyncOpenAI(base_url=base_url, api_key=api_key or "EMPTY",
                              http_client=http_client, **kwargs)  # type: ignore[arg-type]


def get_chat_client(base_url: str, api_key: str | None = None, *,
                    http_client: httpx.Client | None = None, **kwargs: Any) -> openai.OpenAI:
    """The synchronous twin of ``get_chat_client_async``."""
    if http_client is None:
        http_client = open_openai_sync_client()
    _with_hook(http_client, _tag)
    return openai.OpenAI(base_url=base_url, api_key=api_key or "EMPTY",
                         http_client=http_client, **kwargs)  # type: ignore[arg-type]
