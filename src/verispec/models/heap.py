"""Handing freed heap pages back to the system after the large, short-lived allocations of a load.

glibc keeps what a process frees for its next allocations, so a load that briefly needs much
more than it keeps stays at its high-water mark for good: parsing a large vocabulary's tokenizer,
or probing the kernels' row invariance over a large output matrix, leaves tens to hundreds of MiB
of freed memory behind (docs/design/quant.md, "Loading")."""

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
