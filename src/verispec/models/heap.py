"""Handing freed heap pages back to the system after the large, short-lived allocations of a load.

glibc keeps what a process frees for its next allocations, so a load that briefly needs much
more than it keeps stays at its high-water mark for good. Measured on Gemma 3 270M: building
its tokenizer (262,144 tokens, 514,906 merges) takes ~290 MiB while parsing and keeps ~90 MiB;
probing the kernels' row invariance over its 262,144-row output matrix leaves ~24 MiB of
freed logits behind."""

from __future__ import annotations

_malloc_trim = None


def return_freed_heap() -> None:
    """glibc's malloc_trim(0): free pages anywhere in the heap go back; a no-op elsewhere."""
    global _malloc_trim
    if _malloc_trim is None:
        try:
            import ctypes

            _malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)
