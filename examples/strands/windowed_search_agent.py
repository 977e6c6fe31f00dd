"""A user's own search agent, as a Strands user writes it: a plain ``strands.Agent`` with Strands' default history.

``SlidingWindowConversationManager()`` is Strands' default: when a long episode's search results
overflow the model's context, Strands trims the history and retries. Each trimmed history continues
in a new sample of the same rollout (token-in/token-out within each), and RLOO counts the rollout
once. Train it with the HotpotQA recipe (retrieval server and rows as in the README's "Training with verl"):

    PYTHONPATH=$PWD/examples/strands bash examples/strands/train_strands_agent.sh --smoke --cpu \\
        actor_rollout_ref.model.path=/models/tiny rllm.agent_loop.tool_factory=null \\
        rllm.agent_loop.agent_factory=windowed_search_agent:windowed_search_agent

CI runs this factory through verl's own trainer on CPU (``tests/rllm/training/verl/test_examples_cpu.py``),
for rollout 0 of every prompt (rollout 1 runs ``own_client_search_agent``, the same agent on its own client).
"""

from __future__ import annotations

from typing import Any

from strands import Agent
from strands.agent.conversation_manager import SlidingWindowConversationManager

from rllm.agents.search import SEARCH_SYSTEM_PROMPT, resolve_retrieval_url, search_tools


def windowed_search_agent(model: Any, row: dict[str, Any]) -> Agent:
    """The search agent on the rollout's model; whole passages (no ``max_chars``), so long episodes overflow."""
    return Agent(model=model, tools=search_tools(resolve_retrieval_url()),
                 system_prompt=SEARCH_SYSTEM_PROMPT, callback_handler=None,
                 conversation_manager=SlidingWindowConversationManager())
