"""Trace capture for unchanged agents: sessions, a traced OpenAI client, a LiteLLM proxy and a trace store.

::

    from rllm.tracing import ProxyProcess, ProxyConfig, Backend, session, get_chat_client_async, load_trajectory

    with ProxyProcess(ProxyConfig([Backend("http://127.0.0.1:30000/v1", "Qwen/Qwen3-4B")], "traces.db")) as proxy:
        client = get_chat_client_async(proxy.base_url, proxy.api_key)
        async with session("rollout-0", task=task) as s:
            ...  # any agent using `client` (e.g. Strands' OpenAIModel(client=client, model_id="policy"))
    print(load_trajectory(TraceStore("traces.db"), s.id).trajectory)

In training, the trainer serves the policy to such an agent itself (``PolicyServer``; the agent's
factory reads its address with ``policy_endpoint()``) and records the same traces.

Names are imported lazily so that the proxy's own environment, which loads ``rllm.tracing.store`` and
``rllm.tracing.callback``, does not import the client side.
"""

from __future__ import annotations

import importlib
from typing import Any

# Imported eagerly (standard library only) so that ``rllm.tracing.session`` the function is not shadowed by
# ``rllm.tracing.session`` the module once that module is loaded.
from rllm.tracing.session import (
    NO_SESSION,
    SESSION_HEADER,
    ContextThreadPoolExecutor,
    SessionContext,
    bind,
    current_session,
    session,
)

_EXPORTS = {
    "get_chat_client": "rllm.tracing.client",
    "get_chat_client_async": "rllm.tracing.client",
    "session_headers": "rllm.tracing.client",
    "TraceStore": "rllm.tracing.store",
    "Backend": "rllm.tracing.proxy",
    "ProxyConfig": "rllm.tracing.proxy",
    "ProxyProcess": "rllm.tracing.proxy",
    "install_proxy_venv": "rllm.tracing.proxy",
    "find_proxy_venv": "rllm.tracing.proxy",
    "SessionTrajectory": "rllm.tracing.trajectory",
    "trajectory_from_traces": "rllm.tracing.trajectory",
    "load_trajectory": "rllm.tracing.trajectory",
    "PolicyServer": "rllm.tracing.policy_server",
    "PolicyEndpoint": "rllm.tracing.policy_server",
    "policy_endpoint": "rllm.tracing.policy_server",
}

__all__ = [
    "NO_SESSION", "SESSION_HEADER", "Backend", "ContextThreadPoolExecutor", "PolicyEndpoint", "PolicyServer",
    "ProxyConfig", "ProxyProcess", "SessionContext", "SessionTrajectory", "TraceStore",
    "bind", "current_session", "find_proxy_venv", "get_chat_client", "get_chat_client_async", "install_proxy_venv",
    "load_trajectory", "policy_endpoint", "session", "session_headers", "trajectory_from_traces",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rllm.tracing' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
