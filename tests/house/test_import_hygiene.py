"""The core and the headless path never import Textual (checked in a fresh interpreter); no import
circle anywhere in the package (every import counts: inside functions and under TYPE_CHECKING too)."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORE_MODULES = [p.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".")
                for p in (ROOT / "tui" / "core").rglob("*.py") if p.name != "__init__.py"]


def test_core_and_headless_import_no_textual():
    modules = CORE_MODULES + ["tui.headless", "tui.runner", "tui.refserver.server"]
    code = ("import sys\n" + "".join(f"import {m}\n" for m in modules)
            + "bad = sorted(m for m in sys.modules if m == 'textual' or m.startswith('textual.'))\n"
            + "print(','.join(bad))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "", f"Textual imported by the core: {out.stdout}"
    assert len(CORE_MODULES) >= 10


def test_core_never_imports_the_refserver():
    for path in (ROOT / "tui" / "core").rglob("*.py"):
        assert "refserver" not in path.read_text(), f"{path} mentions the refserver"


# --- no import circle anywhere in the package -------------------------------------------------------------
# Every import counts, wherever it sits in the file: module level, inside a function (it runs later, but
# the two modules still need each other) and under TYPE_CHECKING (the types need each other). A circle
# means two modules are one module in two files; the shared piece belongs in a third, lower one.


def package_modules(top: Path) -> dict[str, Path]:
    """Dotted name -> file, for every module of the package at `top` (a package is its __init__)."""
    out = {}
    for path in sorted(top.rglob("*.py")):
        parts = list(path.relative_to(top.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def module_imports(name: str, path: Path, known: set[str]) -> dict[str, int]:
    """The package's modules this one imports (first line of each), relative imports resolved; a
    name imported from a module is that module, or the submodule of that name when there is one.
    The packages above a module (which Python runs first anyway) are not its imports."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):
                found.setdefault(target, node.lineno)
    return found


def import_graph(modules: dict[str, Path]) -> dict[str, dict[str, int]]:
    return {name: module_imports(name, path, set(modules)) for name, path in modules.items()}


def strongly_connected(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's components of more than one module (a module importing itself is not counted)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def one_cycle(edges: dict[str, dict[str, int]], component: list[str]) -> str:
    """A shortest circle through the component's first module, each step with the line that imports."""
    start, members = component[0], set(component)
    came_from: dict[str, str] = {}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(edges[v]):
            if w not in members or w in came_from:
                continue
            came_from[w] = v
            if w == start:
                queue = []
                break
            queue.append(w)
    path, v = [start], came_from[start]
    while v != start:
        path.append(v)
        v = came_from[v]
    path.append(start)
    path.reverse()
    return " -> ".join(f"{a} (line {edges[a][b]})" for a, b in zip(path, path[1:])) + f" -> {start}"


def describe(edges: dict[str, dict[str, int]], components: list[list[str]]) -> str:
    """Each circle: one loop through it, then every import inside it (one of them has to go)."""
    lines = []
    for component in components:
        lines.append(f"circle among {', '.join(component)}:\n  {one_cycle(edges, component)}")
        lines += [f"    {a}:{line} imports {b}" for a in component for b, line in sorted(edges[a].items())
                  if b in component]
    return "\n".join(lines)


def test_no_import_circle_in_the_package():
    modules = package_modules(ROOT / "tui")
    assert len(modules) >= 50 and "tui.app.app" in modules and "tui.embedded.vllm" in modules
    edges = import_graph(modules)
    components = strongly_connected(edges)
    assert components == [], "import circles (function-level and TYPE_CHECKING imports count):\n" + describe(
        edges, components)


def test_the_circle_check_sees_function_level_and_type_checking_imports(tmp_path):
    # the rule must be able to fail: a -> b under TYPE_CHECKING, b -> c inside a function, c -> a at the top
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n")
    (pkg / "b.py").write_text("def f():\n    from . import c\n")
    (pkg / "c.py").write_text("import pkg.a\n")
    (pkg / "d.py").write_text("from . import a\n")      # into the circle, not part of it
    edges = import_graph(package_modules(pkg))
    components = strongly_connected(edges)
    assert components == [["pkg.a", "pkg.b", "pkg.c"]]
    assert describe(edges, components).splitlines()[1].strip() == (
        "pkg.a (line 3) -> pkg.b (line 2) -> pkg.c (line 1) -> pkg.a")
