"""Typed errors the engine raises. Every message names the offending value and what was allowed.

The app shows `str(error)` to the user as-is, so messages are written for people, not for logs.
"""


class EngineError(Exception):
    """Base of every error the engine raises on purpose."""


# --- model files ---------------------------------------------------------------------------------
class ModelFileError(EngineError):
    """The model file cannot be used (corrupt, truncated, wrong format or version)."""


class UnsupportedModelError(ModelFileError):
    """The file is a valid GGUF but uses an architecture or tensor type this engine does not run."""


# --- tokenizer / template ------------------------------------------------------------------------
class TokenizerError(EngineError):
    """The tokenizer described in the GGUF metadata cannot be built."""


class ChatTemplateError(EngineError):
    """The chat template failed to parse or render (including `raise_exception` in the template)."""


class ChatTemplateLimitError(ChatTemplateError):
    """The chat template hit a resource limit (output size, integer size, loop items, time,
    recursion depth); `.limit` names it."""

    def __init__(self, limit: str, message: str):
        self.limit = limit
        super().__init__(message)


class TemplateCancelled(ChatTemplateError):
    """The request was cancelled while its chat template was rendering."""


# --- requests ------------------------------------------------------------------------------------
class ConfigValidationError(EngineError, ValueError):
    """A generation setting is out of range. Carries the field name, the value and the allowed range."""

    def __init__(self, field: str, value, allowed: str):
        self.field, self.value, self.allowed = field, value, allowed
        super().__init__(f"{field}={value!r} is invalid: must be {allowed}")


class PresetFileError(EngineError):
    """generation_config.json (or a saved preset) exists but cannot be read or parsed."""


class ContextOverflowError(EngineError):
    """prompt + max_new_tokens does not fit the context window; refused before any allocation."""


class MemoryBudgetError(EngineError):
    """The KV cache for a request would exceed the memory budget; refused before any allocation."""


class ModelOutputError(EngineError, ValueError):
    """The forward pass gave no usable logits (NaN or inf everywhere), e.g. from corrupt weights."""


class ConstraintError(EngineError):
    """JSON mode could not continue: the grammar allows no token, or the schema is invalid."""


# --- input files ---------------------------------------------------------------------------------
class InputFileError(EngineError):
    """A file named by the user (model, JSON schema, ...) cannot be read as input: missing, not a
    regular file (a directory, FIFO or device would block or never end), unreadable, too large or
    not UTF-8. Carries the role of the file (e.g. "--json-schema"), the path and the problem."""

    def __init__(self, role: str, path, problem: str):
        self.role, self.path, self.problem = role, path, problem
        super().__init__(f"{role} {path}: {problem}")
