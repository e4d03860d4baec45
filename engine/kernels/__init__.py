"""Compute kernels: the op contract (backend.py), its numpy reference (reference.py), and the
llvmlite JIT implementation. Models obtain one with `engine.kernels.backend.get_backend()`."""
