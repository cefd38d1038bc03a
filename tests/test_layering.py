"""Layers only look down: every import of every module (inside functions and TYPE_CHECKING blocks
too), read with `ast`, against the rules below.

    engine     never imports the bench, the server, the CLI or the demo
    models     never imports the engine, the drafters, sampling, or anything above them
    proposers  never call back up into the engine: of it they see the runner interface only
    sampling   imports nothing of the engine, the drafters or the layers above
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import verispec

PACKAGE = Path(verispec.__file__).parent
TOP = ("verispec.bench", "verispec.server", "verispec.cli", "verispec.demo", "verispec.train", "verispec.cluster")

# module prefix -> (forbidden import prefixes, allowed exceptions)
RULES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "verispec.engine": (TOP, ()),
    "verispec.models": (TOP + ("verispec.engine", "verispec.proposers", "verispec.sampling", "verispec.LLM"), ()),
    "verispec.proposers": (TOP + ("verispec.engine", "verispec.LLM"), ("verispec.engine.runner",)),
    "verispec.sampling": (TOP + ("verispec.engine", "verispec.proposers", "verispec.LLM"), ()),
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, dotted name) of every import in `source`, relative ones resolved against `module`;
    `from a import b` counts as a.b too (b may be a module)."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")[: len(module.split(".")) - node.level + is_package]
                base = ".".join(anchor + ([base] if base else []))
            names.append((node.lineno, base))
            names += [(node.lineno, f"{base}.{a.name}") for a in node.names if a.name != "*"]
    return names


def violations(source: str, module: str, is_package: bool = False) -> list[str]:
    found = []
    for prefix, (forbidden, allowed) in RULES.items():
        if not _within(module, prefix):
            continue
        for line, name in imported(source, module, is_package):
            if any(_within(name, f) for f in forbidden) and not any(_within(name, a) for a in allowed):
                found.append(f"{module}:{line} imports {name} ({prefix} must not import {', '.join(forbidden)})")
    return found


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_every_module_respects_the_layers():
    assert len(MODULES) > 30  # the walk found the package
    found = [v for path in MODULES for v in violations(path.read_text(), module_name(path), path.name == "__init__.py")]
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    "module, source",
    [
        ("verispec.engine.llm", "def f():\n    from verispec.bench.profile import CostProfile\n"),
        ("verispec.engine.costs", "import verispec.server.app\n"),
        ("verispec.engine.runner", "from verispec import cli\n"),
        ("verispec.models.tokenizer", "from verispec.engine.runner import TorchRunner\n"),
        ("verispec.models.loaders", "from ..engine import llm\n"),
        ("verispec.proposers.draft_model", "def create():\n    from verispec.engine.llm import LLM\n"),
        ("verispec.proposers.base", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from verispec.engine.assembly import Engine\n"),
    ],
)
def test_a_forbidden_import_is_caught(module, source):
    assert violations(source, module)


def test_allowed_imports_pass():
    assert not violations("from verispec.engine.runner import ModelRunner\n", "verispec.proposers.base")
    assert not violations("from verispec.models.kv_cache import KVCache\n", "verispec.engine.runner")
    assert not violations("from verispec.bench.profile import measure\n", "verispec.cli")
