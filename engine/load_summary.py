"""One line that says what was loaded and how it will run: name, architecture, dominant tensor
type and the kernel path. A fallback to the numpy kernels (tens of times slower) must never be
silent, so the kernel path names why it is not the JIT."""

from __future__ import annotations

from pathlib import Path

from engine.model_protocol import LanguageModel

ISA_LABELS = {"vnni": "avx512-vnni", "avx2": "avx2", "generic": "generic x86-64"}


def kernel_path(backend) -> str:
    """e.g. "JIT avx512-vnni, 2 threads" or "numpy (LOCALCHAT_KERNELS=numpy)"."""
    if getattr(backend, "name", "") == "jit":
        isa = getattr(backend, "isa", "")
        threads = int(getattr(backend, "n_threads", 1))
        library = getattr(backend, "library", None)
        cpu = getattr(library, "cpu", None)
        return _jit_line(isa, threads, cpu.label() if cpu is not None else "")
    why = getattr(backend, "fallback_reason", None)
    return f"numpy ({why})" if why else "numpy"


def _jit_line(isa: str, threads: int, cpu: str) -> str:
    plural = "thread" if threads == 1 else "threads"
    on = f", CPU {cpu}" if cpu else ""
    return f"JIT {ISA_LABELS.get(isa, isa)}, {threads} {plural}{on}"


def dominant_quant(gguf_file) -> str:
    """The tensor type holding the most bytes (what people call the model's quant)."""
    return next(iter(gguf_file.quant_mix()), "?")


def load_line(lm: LanguageModel) -> str:
    """`loaded NAME (ARCH, QUANT): KERNELS` for stderr after a model load."""
    name = lm.gguf.metadata.get("general.name") or Path(str(lm.path)).name
    return f"loaded {name} ({lm.gguf.arch}, {dominant_quant(lm.gguf)}): {kernel_path(lm.backend)}"


def planned_kernel_path(n_threads: int | None = None) -> str:
    """The kernel path a load would take here, without compiling anything (for `info`)."""
    import os

    from engine.kernels.backend import KERNELS_ENV

    if os.environ.get(KERNELS_ENV, "").strip().lower() == "numpy":
        return f"numpy ({KERNELS_ENV}=numpy)"
    try:
        from engine.kernels.compiler import CpuSelectionError, target_cpu
        from engine.kernels.jit_backend import select_isa
        from engine.kernels.threads import physical_cores

        cpu = target_cpu()
        isa = select_isa(cpu)
    except CpuSelectionError:
        raise  # a bad LOCALCHAT_CPU stops a load too; it is the user's to fix
    except Exception as exc:  # the load would fall back the same way; say why
        return f"numpy (JIT kernels unavailable: {type(exc).__name__}: {exc})"
    return _jit_line(isa, n_threads or physical_cores(), cpu.label())
