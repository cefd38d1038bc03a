"""Typed errors: every failure a user can cause has its own class and a clear message.

The server maps these once to OpenAI-style error bodies (`server/errors.py`); nothing here
knows about HTTP.
"""


class VerispecError(Exception):
    """Base class of every error verispec raises on purpose."""


class ModelNotFoundError(VerispecError):
    """A model name or path that resolves to nothing."""


class UnsupportedModelError(VerispecError):
    """A model file or config whose architecture or format we do not implement."""


class UnsupportedWeightFormatError(UnsupportedModelError):
    """A GGUF tensor in a format the row-wise kernels do not unpack (the float32 path may read it)."""


class ContextLengthError(VerispecError):
    """Prompt plus max_tokens (plus draft headroom) does not fit the model's context."""


class InvalidSamplingParamsError(VerispecError, ValueError):
    """A sampling parameter out of its allowed range."""


class InvalidGrammarError(InvalidSamplingParamsError):
    """A structured-output constraint (JSON schema, regex, grammar) that does not compile."""


class IncompatibleDraftError(VerispecError):
    """A drafter that cannot serve this target (e.g. a different vocabulary)."""


class ConfigError(VerispecError, ValueError):
    """An engine option with an invalid value."""


class InvalidSpeculativeConfigError(ConfigError):
    """An unknown speculative method or an invalid option for one."""


class ChatTemplateError(VerispecError):
    """`chat` on a model that has no chat template (and no usable fallback)."""


class InvalidPromptError(VerispecError, ValueError):
    """An empty prompt, or token ids outside the vocabulary."""


class QueueFullError(VerispecError):
    """The server's waiting queue is full (HTTP 503: retry later)."""


class EngineNotReadyError(VerispecError):
    """The server is still loading its model (HTTP 503)."""
