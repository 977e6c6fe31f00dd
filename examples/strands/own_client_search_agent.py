"""A search agent that keeps its own model client: Strands' ``OpenAIModel`` over an OpenAI-compatible endpoint.

The agent is what a Strands user who evaluates through rllm's tracing proxy already has: a plain
``strands.Agent`` (Strands' default history) on Strands' streaming ``OpenAIModel``, whose client is
rllm's traced one. ``policy_endpoint()`` reads where the policy is served from ``RLLM_POLICY_*``: in
evaluation, set them to the LiteLLM proxy (``rllm.tracing.ProxyProcess``); in training, each verl
worker serves the policy itself and sets them (``rllm.agent_loop.own_client: true``), so every call
is sampled token-in/token-out by the rollout's engine and trains exactly as the same agent on the
rollout's model would. Train it with the HotpotQA recipe (retrieval server and rows as in the README):

    PYTHONPATH=$PWD/examples/strands bash examples/strands/train_strands_agent.sh --smoke --cpu \\
        actor_rollout_ref.model.path=/models/tiny rllm.agent_loop.tool_factory=null \\
        rllm.agent_loop.agent_factory=own_client_search_agent:own_client_search_agent rllm.agent_loop.own_client=true

CI runs this factory through verl's own trainer on CPU (``tests/rllm/training/verl/test_examples_cpu.py``),
for rollout 1 of every prompt beside ``windowed_search_agent`` (the same agent on the rollout's
model) for rollout 0, and checks that the two rollouts of a prompt train on the same samples.
"""

from __future__ import annotations

from typing import Any

from strands import Agent
from strands.models.openai import OpenAIModel

from rllm.agents.search import SEARCH_SYSTEM_PROMPT, resolve_retrieval_url, search_tools
from rllm.tracing import policy_endpoint


def own_client_search_agent(model: Any, row: dict[str, Any]) -> Agent:
    """The search agent on its own client (the ``model`` it is given is not used); whole passages."""
    endpoint = policy_endpoint()
    return Agent(model=OpenAIModel(client=endpoint.async_client(), model_id=endpoint.model),
                 tools=search_tools(resolve_retrieval_url()), system_prompt=SEARCH_SYSTEM_PROMPT,
                 callback_handler=None)
