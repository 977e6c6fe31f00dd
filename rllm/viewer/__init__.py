"""``python -m rllm.viewer PATH``: see what a run trained on, or what an evaluation's agent did, in a browser.

PATH is a run directory (``AgentTrainer``'s, a recipe's, the quickstart's: its ``metrics.jsonl``, the steps'
rollouts in ``rollouts/`` and any episodes JSONL it holds) or an ``AgentWorkflowEngine`` episodes JSONL. The
viewer serves it on 127.0.0.1, as ``tensorboard --logdir`` does: ``sources`` reads the files lazily, ``views``
decides what a page shows, ``app`` serves the pages, ``cli`` is the command (``rllm-view`` too).
"""

from rllm.viewer.app import create_app
from rllm.viewer.sources import NotServable, open_source

__all__ = ["NotServable", "create_app", "open_source"]
