"""The core's layout is a rule, not a hope: each part is a folder, imports point one way, no cycle
(none hidden behind TYPE_CHECKING either), no module much over 400 lines (tui/core/README.md)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "tui" / "core"
# What each part of the core may import (besides itself). The direction: config and log know
# nothing; evidence and checks are pure; report reads the log; server talks to servers; soak runs it all.
ALLOWED = {
    "config": set(),
    "log": {"config"},
    "evidence": {"config"},
    "checks": {"config"},
    "report": {"config", "log", "checks"},
    "server": {"config", "log"},
    "soak": {"config", "log", "evidence", "checks", "report", "server"},
}
MAX_LINES = 400


def modules() -> dict[str, Path]:
    out = {}
    for path in CORE.rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every core module this one imports, at any depth of the file (TYPE_CHECKING blocks and
    function bodies included), relative imports resolved."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        for target in targets:
            while target and target not in known:
                target = target.rsplit(".", 1)[0] if "." in target else ""
            if target and target != name and not name.startswith(target + "."):
                found.add(target)
    return found


def part(module: str) -> str | None:
    rest = module.removeprefix("tui.core").lstrip(".")
    return rest.split(".", 1)[0] if rest else None


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def test_every_module_of_the_core_is_in_a_part():
    loose = [name for name in modules() if name != "tui.core" and part(name) not in ALLOWED]
    assert loose == [], f"modules outside the core's parts: {loose}"


def test_imports_point_one_way():
    wrong = []
    for name, targets in graph().items():
        mine = part(name)
        for target in targets:
            theirs = part(target)
            if theirs is None or theirs == mine:
                continue
            if mine is None or theirs not in ALLOWED[mine]:
                wrong.append(f"{name} -> {target}")
    assert wrong == [], "imports against the direction:\n" + "\n".join(sorted(wrong))


def test_the_core_imports_nothing_above_it():
    """Only the version string comes from the package above (tui/__init__.py); never the app, the
    embedded servers, the reference server or the command line."""
    bad = []
    for name, path in modules().items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
                targets = [base] if base != "tui" else [f"tui.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            bad += [f"{name} -> {t}" for t in targets
                    if t.startswith("tui") and not t.startswith("tui.core") and t != "tui.__version__"]
    assert bad == [], bad


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in edges:
        if v not in index:
            strong(v)
    return found


def test_no_import_cycle():
    assert cycles(graph()) == []


def test_the_cycle_detector_sees_a_cycle_behind_type_checking(tmp_path):
    # the rule must be able to fail: two modules that import each other, one under TYPE_CHECKING
    (tmp_path / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n")
    (tmp_path / "b.py").write_text("from .a import A\n")
    names = {"pkg.a": tmp_path / "a.py", "pkg.b": tmp_path / "b.py"}
    edges = {name: imports(name, path, set(names)) for name, path in names.items()}
    assert cycles(edges) == [["pkg.a", "pkg.b"]]


def test_the_direction_rule_sees_an_import_against_it():
    edges = {"tui.core.checks.x": {"tui.core.soak.engine"}}
    wrong = [f"{n} -> {t}" for n, ts in edges.items() for t in ts if part(t) not in ALLOWED[part(n)]]
    assert wrong == ["tui.core.checks.x -> tui.core.soak.engine"]


@pytest.mark.parametrize("name", sorted(modules()))
def test_modules_stay_small(name):
    lines = sum(1 for _ in modules()[name].open())
    assert lines <= MAX_LINES, f"{name} has {lines} lines (split what does several things)"


def package_modules() -> list[Path]:
    return sorted(p for p in (ROOT / "tui").rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("path", package_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_of_the_package_stays_small(path):
    """The whole house, not only the core: the command line, the app, the embedded engines, the
    reference server (tui/commands/ holds one module per command; cli.py only dispatches)."""
    lines = sum(1 for _ in path.open())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines (split what does several things)"


def test_a_command_is_one_module():
    """Every subcommand is declared by its own module in tui/commands/ (add_parser sets its `func`)."""
    from tui.cli import build_parser
    from tui.commands import COMMANDS

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert list(sub.choices) == list(COMMANDS)
    for name, parser in sub.choices.items():
        func = parser.get_default("func")
        assert func is not None and func.__module__ == f"tui.commands.{name}", name


# The house around the core, one direction (tui/README.md draws it): the command line dispatches to
# the commands; a command may use any part; the app and the matrix draw and run; the runner starts
# servers (launched, embedded, replicas behind a router) and the soak; the embedded engines and the
# headless console know only the core; the reference fault server knows nothing of hitproof (it
# shares no code with checks).
PACKAGE_ALLOWED = {
    "__main__": {"cli"},
    "cli": {"commands", "core"},
    "commands": {"app", "core", "embedded", "headless", "matrix", "refserver", "runner"},
    "app": {"core", "matrix"},
    "matrix": {"core", "runner"},
    "runner": {"core", "embedded"},
    "headless": {"core"},
    "embedded": {"core"},
    "refserver": set(),
    "core": set(),
}


def package_part(module: str) -> str:
    parts = module.split(".")
    return "tui" if len(parts) == 1 else parts[1]


def package_graph() -> dict[str, set[str]]:
    mods = {}
    for path in package_modules():
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def wrong_way(edges: dict[str, set[str]]) -> list[str]:
    wrong = []
    for name, targets in edges.items():
        mine = package_part(name)
        for target in targets:
            theirs = package_part(target)
            if theirs in (mine, "tui"):           # within a part, or the version string
                continue
            if theirs not in PACKAGE_ALLOWED.get(mine, set()):
                wrong.append(f"{name} -> {target}")
    return sorted(wrong)


def test_the_house_imports_point_one_way():
    assert set(map(package_part, package_graph())) - {"tui"} <= set(PACKAGE_ALLOWED), "a new part: give it a row"
    assert wrong_way(package_graph()) == []


def test_the_house_rule_sees_an_import_against_it():
    assert wrong_way({"tui.embedded.vllm": {"tui.app.app"}, "tui.refserver.faults": {"tui.core.checks"},
                      "tui.core.soak.engine": {"tui.runner"}, "tui.app.app": {"tui.core.log"}}) == [
        "tui.core.soak.engine -> tui.runner", "tui.embedded.vllm -> tui.app.app",
        "tui.refserver.faults -> tui.core.checks"]
