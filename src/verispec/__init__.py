"""verispec: lossless speculative decoding."""

from verispec.config import EngineConfig, SamplingParams, SpeculativeConfig
from verispec.engine.llm import LLM, CompletionOutput, RequestOutput

__all__ = ["LLM", "SamplingParams", "SpeculativeConfig", "EngineConfig", "RequestOutput", "CompletionOutput"]
__version__ = "0.1.0"
