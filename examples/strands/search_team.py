"""Two-agent HotpotQA teams: a researcher that searches, then a writer that answers, as a Strands ``Graph`` or ``Swarm``.

``search_team`` wires them as a ``Graph`` (researcher -> writer); ``search_swarm`` as a ``Swarm`` in which
the researcher hands off to the writer with Strands' ``handoff_to_agent`` tool. Either team is one
episode: one trajectory per node that ran (named by its node id), each sample with exact tokens, one
reward for the writer's answer, RLOO over the prompt's team runs.
Train it with the HotpotQA recipe (retrieval server and rows as in the README's "Training with verl"):

    PYTHONPATH=$PWD/examples/strands bash examples/strands/train_strands_agent.sh --smoke --cpu \\
        actor_rollout_ref.model.path=/models/tiny rllm.agent_loop.tool_factory=null \\
        rllm.agent_loop.agent_factory=search_team:search_team     # or search_team:search_swarm

CI runs exactly this through verl's own trainer on CPU (``tests/rllm/training/verl/test_examples_cpu.py``).
"""

from __future__ import annotations

from typing import Any

from strands import Agent
from strands.multiagent import GraphBuilder, Swarm
from strands.multiagent.graph import Graph

from rllm.agents.search import resolve_retrieval_url, search_tools

RESEARCHER = ("You are the researcher. Search the Wikipedia paragraphs with local_search for every fact the "
              "question needs, then summarise what you found for the writer.")
SWARM_RESEARCHER = RESEARCHER + " When you have the facts, hand off to the writer with handoff_to_agent."
WRITER = ("You are the writer. From the researcher's notes, answer the question with a short final answer "
          "inside \\boxed{}, for example \\boxed{Paris} or \\boxed{yes}.")


def search_team(model: Any, row: dict[str, Any]) -> Graph:
    """Researcher -> writer, both on the rollout's model (the nodes are named by their ids)."""
    url = resolve_retrieval_url()
    builder = GraphBuilder()
    builder.add_node(Agent(name="researcher", model=model, tools=search_tools(url), system_prompt=RESEARCHER,
                           callback_handler=None), "researcher")
    builder.add_node(Agent(name="writer", model=model, system_prompt=WRITER, callback_handler=None), "writer")
    builder.add_edge("researcher", "writer")
    builder.set_entry_point("researcher")
    return builder.build()


def search_swarm(model: Any, row: dict[str, Any]) -> Swarm:
    """The same researcher and writer as a ``Swarm``: the researcher hands off to the writer, who answers."""
    url = resolve_retrieval_url()
    # Each node of a Swarm also carries the hand-off tool's schema: passages cut to 200 characters keep a search
    # and the hand-off within a small context.
    researcher = Agent(name="researcher", model=model, tools=search_tools(url, max_chars=200),
                       system_prompt=SWARM_RESEARCHER, callback_handler=None)
    writer = Agent(name="writer", model=model, system_prompt=WRITER, callback_handler=None)
    return Swarm([researcher, writer], entry_point=researcher, max_handoffs=4, max_iterations=4)
