"""Lossless speculative decoding over Hugging Face causal LMs, drafting from draftstore."""
from decoder.stats import DecoderSettings, Generation, GenerationStats
from decoder.speculative import SpeculativeDecoder

__all__ = ["SpeculativeDecoder", "DecoderSettings", "Generation", "GenerationStats"]
