"""Every import of the project's own modules resolves, the ones inside functions too.

An import inside a function runs only when that function does (setup paths, measurements,
real-server fixtures), so a module moved by a refactor can leave one broken until a slow tier
trips on it; this walks the source and resolves each `from tui... import name` now.
"""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TREES = ("tui", "tests", "benchmarks")


def own_imports():
    for tree in TREES:
        for path in sorted((ROOT / tree).rglob("*.py")):
            rel = path.relative_to(ROOT)
            parts = rel.with_suffix("").parts
            package = parts[:-1] if path.name != "__init__.py" else parts[:-1]
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not isinstance(node, ast.ImportFrom):
                    continue
                if node.level:
                    base = list(package[: len(package) - node.level + 1])
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                if module.split(".")[0] in ("tui", "tests"):
                    yield f"{rel}:{node.lineno}", module, [a.name for a in node.names]


def unresolved() -> list[str]:
    broken = []
    for where, module, names in own_imports():
        try:
            loaded = importlib.import_module(module)
        except ImportError as error:
            broken.append(f"{where}: {module} ({error})")
            continue
        for name in names:
            if name == "*" or hasattr(loaded, name):
                continue
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                broken.append(f"{where}: {name} from {module}")
    return broken


def test_every_own_import_resolves():
    assert unresolved() == []


def test_the_walk_sees_imports_inside_functions():
    found = {(where.split(":")[0], module) for where, module, _ in own_imports()}
    assert ("tui/embedded/measure_lora_drafter.py", "tui.core.evidence.text") in found
