"""Task data: loaders for the datasets the examples train and evaluate on."""

from rllm.data.gaia import load_gaia
from rllm.data.hotpotqa import SHIPPED_HOTPOTQA, hf_to_hotpotqa, hotpotqa_paragraphs, load_hotpotqa

__all__ = ["SHIPPED_HOTPOTQA", "hf_to_hotpotqa", "hotpotqa_paragraphs", "load_gaia", "load_hotpotqa"]
