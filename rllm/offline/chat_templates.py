"""The chat templates that models really ship, by family, for tests and audits.

Most come from the installed PyPI package ``trl`` (``trl/chat_templates/*.jinja``: byte-identical
copies of the hub templates, which trl's own tests compare against the hub tokenizers); they are
read from the package, never copied here. A family trl lacks is carried in
``rllm/offline/templates/`` with its source named in the README beside it.

Each ``TemplateFamily`` also says which of Qwen's vocabularies its models use and which tool-call
parser reads what they write, so a test can build exactly what a user of that model would run.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rllm.offline.qwen_tokenizer import QwenVocab, build_qwen_tokenizer

_CARRIED_DIR = Path(__file__).with_name("templates")


@dataclass(frozen=True)
class TemplateFamily:
    """One model family's shipped chat template and what goes with it.

    Attributes:
        name: The template's file name without ``.jinja`` (trl's name where trl has it).
        models: Models that ship it, for messages and docs.
        vocab: The Qwen vocabulary its models use.
        tool_parser: The rllm parser for the tool calls its models write.
        source: ``trl`` (read from the installed package) or ``carried`` (in this repository).
        thinking: The template renders ``reasoning_content`` as a ``<think>`` block.
        chat_template_kwargs: Template variables a user of these models typically sets.
    """

    name: str
    models: str
    vocab: QwenVocab
    tool_parser: str
    source: str = "trl"
    thinking: bool = False
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)

    def template(self) -> str:
        """The template text."""
        return load_chat_template(self.name, self.source)

    def tokenizer(self) -> Any:
        """Qwen's real tokenizer for this family, with this template set."""
        return build_qwen_tokenizer(self.template(), self.vocab)


FAMILIES: dict[str, TemplateFamily] = {
    f.name: f
    for f in (
        TemplateFamily("qwen2_5", "Qwen2.5-*-Instruct", QwenVocab.QWEN, "hermes"),
        TemplateFamily("qwen3", "Qwen3-0.6B ... Qwen3-235B (hybrid thinking; the recipe's Qwen3-4B)", QwenVocab.QWEN,
                       "hermes", thinking=True),
        TemplateFamily("qwen3_instruct_2507", "Qwen3-4B-Instruct-2507, Qwen3-30B-A3B-Instruct-2507", QwenVocab.QWEN,
                       "hermes"),
        TemplateFamily("qwen3_coder", "Qwen3-Coder-30B-A3B-Instruct, Qwen3-Coder-480B-A35B-Instruct", QwenVocab.QWEN,
                       "qwen3_coder", source="carried"),
        TemplateFamily("qwen3_5_think", "Qwen3.5-4B and larger", QwenVocab.QWEN3_5, "qwen3_coder", thinking=True),
        TemplateFamily("qwen3_5_nothink", "Qwen3.5-2B and smaller", QwenVocab.QWEN3_5, "qwen3_coder", thinking=True),
        TemplateFamily("qwen3_6", "Qwen3.6-27B, Qwen3.6-35B-A3B", QwenVocab.QWEN3_5, "qwen3_coder", thinking=True),
        TemplateFamily("qwen3_8", "Qwen3.8-27B", QwenVocab.QWEN3_5, "qwen3_coder", thinking=True),
    )
}
"""The families token-in/token-out is tested on, by template name."""


def _trl_template_dir() -> Path:
    spec = importlib.util.find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the real chat templates come from the PyPI package 'trl' (pip install 'trl>=1.16')")
    return Path(next(iter(spec.submodule_search_locations))) / "chat_templates"


def load_chat_template(name: str, source: str = "trl") -> str:
    """The text of template ``name`` from trl's package (``source="trl"``) or this repository."""
    directory = _CARRIED_DIR if source == "carried" else _trl_template_dir()
    path = directory / f"{name}.jinja"
    if not path.is_file():
        known = sorted(p.stem for p in directory.glob("*.jinja"))
        raise FileNotFoundError(f"no chat template '{name}' in {directory}; known: {known}")
    return path.read_text(encoding="utf-8")
