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


class ChatImportError(EngineError, ValueError):
    """A chat export file (File > Import chat...) cannot be imported: too large, not JSON, nested
    too deeply, a value of the wrong type, or a tree whose ids and parents do not fit together.
    Carries the path and the problem; nothing of the file has been imported."""

    def __init__(self, path, problem: str):
        self.path, self.problem = path, problem
        super().__init__(f"{path}: {problem}")


# --- batched serving (engine/batching) -----------------------------------------------------------
class KVAdmissionError(MemoryBudgetError):
    """The batch scheduler cannot admit a request's worst-case KV cache (prompt + max new tokens,
    at the model's bytes per position). `never_fits`: it exceeds the whole budget, so waiting
    cannot help (a server answers 400); otherwise it would have to wait and could not (429).
    Carries bytes_needed, bytes_available (budget minus what running requests reserve) and
    budget_bytes."""

    def __init__(
        self, bytes_needed: int, bytes_available: int, budget_bytes: int, *, never_fits: bool
    ):
        self.bytes_needed, self.bytes_available = int(bytes_needed), int(bytes_available)
        self.budget_bytes, self.never_fits = int(budget_bytes), bool(never_fits)
        mib = 2**20
        if never_fits:
            message = (
                f"The request's KV cache needs {bytes_needed} bytes ({bytes_needed / mib:.1f} MiB), "
                f"more than the whole KV budget of {budget_bytes} bytes "
                f"({budget_bytes / mib:.1f} MiB); ask for fewer tokens (prompt + max tokens)"
            )
        else:
            message = (
                f"The request's KV cache needs {bytes_needed} bytes ({bytes_needed / mib:.1f} MiB) "
                f"and {bytes_available} bytes ({bytes_available / mib:.1f} MiB) of the "
                f"{budget_bytes}-byte KV budget are free"
            )
        super().__init__(message)


class QueueFullError(EngineError):
    """The batch scheduler would have to queue a request and its queue is full (a server answers
    429). Carries the request's bytes_needed, bytes_available and the queue's max_queue."""

    def __init__(self, bytes_needed: int, bytes_available: int, max_queue: int, running: int):
        self.bytes_needed, self.bytes_available = int(bytes_needed), int(bytes_available)
        self.max_queue, self.running = int(max_queue), int(running)
        super().__init__(
            f"The server is busy: {running} requests are running and the queue of {max_queue} "
            f"waiting requests is full (this request's KV cache needs {bytes_needed} bytes, "
            f"{bytes_available} bytes are free); try again later"
        )


class SchedulerClosedError(EngineError):
    """A request was submitted to a batch scheduler that has been closed (the model is unloading)."""
