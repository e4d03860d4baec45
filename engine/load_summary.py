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
        line = _jit_line(isa, threads, cpu.label() if cpu is not None else "")
        return line + fallback_note(getattr(backend, "fallbacks", None) or {})
    why = getattr(backend, "fallback_reason", None)
    return f"numpy ({why})" if why else "numpy"


def fallback_note(fallbacks: dict[str, int]) -> str:
    """ "; numpy fallback: attention: head_dim 80 is not a multiple of 16 (24 calls)", or ""."""
    if not fallbacks:
        return ""
    parts = [f"{key} ({n} call{'s' if n != 1 else ''})" for key, n in fallbacks.items()]
    return "; numpy fallback: " + ", ".join(parts)


def planned_fallbacks(quant_mix: dict, head_dim: int | None) -> list[str]:
    """The ops a load of this file would run on numpy instead of the JIT, known from the file
    alone (for `info`): mat-muls of tensor types without a kernel, attention on a head size
    the kernel does not take."""
    from engine.kernels.jit_backend import jit_weight_types

    kernels = jit_weight_types()
    planned = [f"linear: {name} weights" for name in quant_mix if name not in kernels]
    if head_dim and head_dim % 16:
        planned.append(f"attention: head_dim {head_dim} is not a multiple of 16")
    return planned


def _jit_line(isa: str, threads: int, cpu: str) -> str:
    plural = "thread" if threads == 1 else "threads"
    on = f", CPU {cpu}" if cpu else ""
    return f"JIT {ISA_LABELS.get(isa, isa)}, {threads} {plural}{on}"


def dominant_quant(gguf_file) -> str:
    """The tensor type holding the most bytes (what people call the model's quant)."""
    return next(iter(gguf_file.quant_mix()), "?")


def load_line(lm: LanguageModel) -> str:
    """`loaded NAME (ARCH, QUANT), KV cache TYPE: KERNELS[; weights RECORDS]` for stderr after a
    model load (RECORDS: repacked, or mapped from the record cache; engine/kernels/record_cache.py)."""
    name = lm.gguf.metadata.get("general.name") or Path(str(lm.path)).name
    kv = getattr(getattr(lm, "model", None), "cache_type", "f16")  # stand-ins: the default
    records = getattr(getattr(lm, "records", None), "status", "")
    return (
        f"loaded {name} ({lm.gguf.arch}, {dominant_quant(lm.gguf)}), KV cache {kv}: "
        f"{kernel_path(lm.backend)}" + (f"; weights {records}" if records else "")
    )


def planned_kernel_path(
    n_threads: int | None = None, quant_mix: dict | None = None, head_dim: int | None = None
) -> str:
    """The kernel path a load would take here, without compiling anything (for `info`); with
    the file's quant mix and head size, also the ops that would fall back to numpy."""
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
    line = _jit_line(isa, n_threads or physical_cores(), cpu.label())
    planned = planned_fallbacks(quant_mix or {}, head_dim)
    return line + ("; numpy fallback: " + ", ".join(planned) if planned else "")
