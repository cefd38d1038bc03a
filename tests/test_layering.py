"""The package's structure, read with `ast` from every module (imports inside functions and
TYPE_CHECKING blocks too), against the rules below; each rule is shown to fail on a planted
violation.

1. Layers import only downward:
       faces (cli, flags, demo, server, cluster, bench, train)
       -> question sets (data -> prompts, workloads, conversations)
       -> engine -> proposers -> {runners, sampling, structured} -> models -> config -> errors
   A module may import its own package and any layer below its own (the engine not models: it
   sees them through the layer between); faces may also import faces; the three packages beside
   one another (runners, sampling, structured) import none of each other.
2. No import loops between modules.
3. Capabilities are declared, never probed: no getattr/hasattr on a drafter or a runner in the engine.
4. A backend or method name is branched on only inside its registry's package (runners/,
   proposers/): nowhere else is a registered name compared with a string constant.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import verispec
from verispec.proposers import PROPOSERS
from verispec.runners.registry import backends

PACKAGE = Path(verispec.__file__).parent

# layer rank of each top-level part of the package (the root package re-exports the engine's LLM: a face)
LAYERS: dict[str, int] = {
    "verispec.errors": 0, "verispec.config": 1,
    "verispec.models": 2,
    "verispec.runners": 3, "verispec.sampling": 3, "verispec.structured": 3,
    "verispec.proposers": 4,
    "verispec.engine": 5,
    "verispec.prompts": 6, "verispec.workloads": 6, "verispec.conversations": 6, "verispec.data": 7,
    "verispec.cli": 8, "verispec.flags": 8, "verispec.demo": 8, "verispec.server": 8, "verispec.cluster": 8,
    "verispec.bench": 8, "verispec.train": 8, "verispec": 8,
}
FACES = 8
# The engine sees models only through the layer between (runners, sampling, proposers): it never
# reaches past it.
NO_SKIPPING = {"verispec.engine": ("verispec.models",)}
REGISTRY_PACKAGES = ("verispec.runners", "verispec.proposers")  # where backend and method names may be branched on
# an EAGLE head's format ("eagle1", "eagle3": models/heads/) shares its string with the eagle3 method, not its meaning
SAME_STRING_OTHER_MEANING = ("verispec.models.heads",)
PROBED_WORDS = ("proposer", "drafter", "runner", "target", "model")  # a getattr on any of these probes a capability


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def part_of(name: str) -> str:
    """The layer entry a dotted name belongs to (the longest prefix in LAYERS)."""
    return max((p for p in LAYERS if _within(name, p)), key=len)


def imported(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, dotted name) of every verispec import in `source`, relative ones resolved against
    `module`; `from a import b` counts as a.b (b may be a module, else a name in a)."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")[: len(module.split(".")) - node.level + is_package]
                base = ".".join(anchor + ([base] if base else []))
            names += [(node.lineno, f"{base}.{a.name}") for a in node.names if a.name != "*"] or [(node.lineno, base)]
    return [(line, n) for line, n in names if _within(n, "verispec")]


def layer_violations(source: str, module: str, is_package: bool = False) -> list[str]:
    mine = part_of(module)
    found = []
    for line, name in imported(source, module, is_package):
        theirs = part_of(name)
        if any(_within(name, skipped) for skipped in NO_SKIPPING.get(mine, ())):
            found.append(f"{module}:{line} imports {name} ({mine} reaches past the layer below it)")
            continue
        if theirs == mine or _within(name, mine) or LAYERS[theirs] < LAYERS[mine]:
            continue
        if LAYERS[mine] == FACES and LAYERS[theirs] == FACES and theirs != "verispec":
            continue
        if theirs == "verispec" and LAYERS[mine] == FACES:
            continue
        found.append(f"{module}:{line} imports {name} ({mine} is below {theirs})")
    return found


def import_graph(modules: dict[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """module -> the modules it imports (a name resolved to the longest module it lies in)."""
    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for m, (source, is_package) in modules.items():
        for _, name in imported(source, m, is_package):
            target = resolve(name)
            if target is not None and target != m:
                graph[m].add(target)
    return graph


def loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import loops: strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def probe_violations(source: str, module: str) -> list[str]:
    """getattr/hasattr calls on a drafter or runner in the engine."""
    if not _within(module, "verispec.engine"):
        return []
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr") and node.args:
            subject = ast.unparse(node.args[0]).lower()
            if any(word in subject for word in PROBED_WORDS):
                found.append(f"{module}:{node.lineno} probes {ast.unparse(node)}")
    return found


def name_violations(source: str, module: str, names: set[str]) -> list[str]:
    """Comparisons (==, !=, in, not in, startswith) of anything with a string constant that is a
    registered backend or method name, outside the registries' packages."""
    if any(_within(module, p) for p in REGISTRY_PACKAGES + SAME_STRING_OTHER_MEANING):
        return []
    found = []

    def constants(node: ast.AST) -> list[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return [c for e in node.elts for c in constants(e)]
        return []

    for node in ast.walk(ast.parse(source)):
        strings: list[str] = []
        if isinstance(node, ast.Compare):
            strings = [s for part in [node.left, *node.comparators] for s in constants(part)]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("startswith", "endswith"):
            strings = [s for a in node.args for s in constants(a)]
        hits = sorted({s for s in strings if s in names})
        if hits:
            found.append(f"{module}:{node.lineno} branches on {', '.join(hits)}: {ast.unparse(node)[:80]}")
    return found


MODULES = {module_name(p): (p.read_text(), p.name == "__init__.py") for p in sorted(PACKAGE.rglob("*.py"))}
REGISTERED = set(PROPOSERS) | set(backends())


def test_the_walk_found_the_package():
    assert len(MODULES) > 60 and {"torch", "llamacpp"} <= set(backends()) and {"suffix", "eagle3"} <= set(PROPOSERS)
    assert all(part_of(m) in LAYERS for m in MODULES)


def test_every_module_imports_only_downward():
    found = [v for m, (source, is_package) in MODULES.items() for v in layer_violations(source, m, is_package)]
    assert not found, "\n".join(found)


def test_no_import_loops():
    assert not loops(import_graph(MODULES))


def test_the_engine_never_probes_a_drafter_or_a_runner():
    found = [v for m, (source, _) in MODULES.items() for v in probe_violations(source, m)]
    assert not found, "\n".join(found)


def test_backend_and_method_names_are_branched_on_only_in_their_registries():
    found = [v for m, (source, _) in MODULES.items() for v in name_violations(source, m, REGISTERED)]
    assert not found, "\n".join(found)


# -- each rule fails on a planted violation ------------------------------------------------------
@pytest.mark.parametrize(
    "module, source",
    [
        ("verispec.engine.llm", "def f():\n    from verispec.bench.profile import CostProfile\n"),  # engine -> a face
        ("verispec.engine.decoder", "from verispec.models.kernels.rowwise import argmax_rows\n"),  # engine -> models
        ("verispec.engine.assembly", "from verispec.models.decoder.transformer import PROMPT_ROWS\n"),
        ("verispec.runners.costs", "import verispec.server.app\n"),
        ("verispec.runners.torch_runner", "from verispec.proposers import Draft\n"),  # runners -> proposers
        ("verispec.models.tokenizers.tokenizer", "from verispec.runners.torch_runner import TorchRunner\n"),
        ("verispec.models.weights.loaders", "from ...engine import llm\n"),
        ("verispec.proposers.draft_model", "def create():\n    from verispec.engine.llm import LLM\n"),
        ("verispec.proposers.base", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from verispec.engine.assembly import Engine\n"),
        ("verispec.config", "from verispec.runners.registry import BACKENDS\n"),  # config -> the registry
        ("verispec.data", "from verispec.train.cli import run\n"),  # workloads -> a face
        ("verispec.sampling.processors", "from verispec import LLM\n"),
    ],
)
def test_an_upward_import_is_caught(module, source):
    assert layer_violations(source, module)


def test_allowed_imports_pass():
    assert not layer_violations("from verispec.runners.base import ModelRunner\n", "verispec.proposers.base")
    assert not layer_violations("from verispec.models.decoder.kv_cache import KVCache\n", "verispec.runners.torch_runner")
    assert not layer_violations("from verispec.bench.profile import measure\n", "verispec.cli")
    assert not layer_violations("from verispec import LLM\n", "verispec.demo")
    assert not layer_violations("from .policy import SpeculationPolicy\n", "verispec.engine.decoder")


def test_a_planted_loop_is_caught():
    planted = dict(MODULES)
    planted["verispec.cli"] = (MODULES["verispec.cli"][0] + "\nfrom verispec.demo import run_demo\n", False)
    planted["verispec.demo"] = (MODULES["verispec.demo"][0] + "\nfrom verispec.cli import main\n", False)
    assert ["verispec.cli", "verispec.demo"] in loops(import_graph(planted))


@pytest.mark.parametrize("source", [
    "def f(self):\n    return getattr(self.proposer, 'labels_drafts', False)\n",
    "def f(runner):\n    return hasattr(runner, 'verify_chunks')\n",
    "def f(self):\n    return getattr(self.target, 'supports_trees', False)\n",
])
def test_a_planted_probe_is_caught(source):
    assert probe_violations(source, "verispec.engine.decoder")
    assert not probe_violations(source, "verispec.bench.run")  # the rule is the engine's


@pytest.mark.parametrize("source", [
    "def f(backend):\n    return backend == 'torch'\n",
    "def f(base):\n    return base in ('prompt_lookup', 'draft_model')\n",
    "def f(name):\n    return name.startswith('llamacpp')\n",
    "def f(config):\n    return config.method != 'hybrid'\n",
])
def test_a_planted_name_branch_is_caught(source):
    assert name_violations(source, "verispec.bench.run", REGISTERED)
    assert name_violations(source, "verispec.config", REGISTERED)
    assert not name_violations(source, "verispec.runners.torch_runner", REGISTERED)  # inside a registry
