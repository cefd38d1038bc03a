"""Suffix decoding's search in C++ (search.cpp, module.cpp): built once into the verispec cache
(models/kernels/build.py) the first time a suffix drafter is created, in seconds, and imported.
`module()` is None, and the drafter searches in Python (the reference: the same drafts), where
VERISPEC_KERNELS=0 is set or the build fails (no C++ compiler, no ninja: logged once, with why)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from verispec.models.kernels import build

log = logging.getLogger("verispec")

HERE = Path(__file__).parent
SOURCES = [HERE / "search.cpp", HERE / "module.cpp"]
HEADERS = [HERE / "search.h"]
FLAGS = ["-O2", "-ffp-contract=off", "-fno-fast-math"]  # Python's double arithmetic, operation for operation
_state: dict[str, object] = {}


def module():
    """The compiled search module, built if not cached; None where it cannot be used."""
    if "module" not in _state:
        _state["module"] = None
        if os.environ.get("VERISPEC_KERNELS", "1") != "0":
            try:
                key = build.build_key([*SOURCES, *HEADERS], FLAGS)
                _state["module"] = build.build_module(f"verispec_suffix_{key}", f"suffix-{key}", SOURCES, HERE, FLAGS, [],
                                                      "suffix decoding's search")
            except Exception as e:  # a missing compiler or ninja: the Python search instead, said once
                log.warning("suffix decoding's C++ search unavailable (%s: %s); searching in Python", type(e).__name__,
                            str(e).splitlines()[0] if str(e) else "")
    return _state["module"]


def loaded():
    """The module where this process built or loaded it already, else None (never builds)."""
    return _state.get("module")
