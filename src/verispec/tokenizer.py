"""`verispec.tokenizer`, kept for callers that import it here: the tokenizer is part of a loaded
model and lives in `verispec.models.tokenizer`."""

from verispec.models.tokenizer import GEMMA_FALLBACK_TEMPLATE, Tokenizer

__all__ = ["GEMMA_FALLBACK_TEMPLATE", "Tokenizer"]
