"""Workflows (one task in, one ``Episode`` out, reusable via ``reset()``) and the batch runner that pools them."""

from rllm.workflows.agent_workflow_engine import AgentWorkflowEngine
from rllm.workflows.base import Workflow
from rllm.workflows.strands_workflow import StrandsWorkflow

__all__ = ["AgentWorkflowEngine", "StrandsWorkflow", "Workflow"]
