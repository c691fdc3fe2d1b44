"""The finding kinds, read from where the code emits them: every call of a `finding(state, KIND,
SEVERITY, ...)` method and every `Finding(kind=..., severity=...)` with literal values, across tui/.
A kind the code builds from a variable is found through the meanings the manual gives (json_page)."""

from __future__ import annotations

import ast
from pathlib import Path

TUI = Path(__file__).resolve().parents[2] / "tui"
SEVERITIES = ("fail", "warn", "info")


def _const(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _severities(node: ast.AST | None) -> set[str]:
    """A literal severity, or the literals of a conditional expression ("fail" if x else "warn")."""
    if node is None:
        return set()
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and n.value in SEVERITIES}


def scan(root: Path = TUI) -> dict[str, dict[str, set[str]]]:
    """{kind: {"severities": {...}, "where": {module, ...}}} for every literal kind emitted."""
    found: dict[str, dict[str, set[str]]] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        if rel.startswith(("tui/refserver/", "tui/app/")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            keywords = {k.arg: k.value for k in node.keywords if k.arg}
            kind, severity = None, None
            if name == "Finding":
                kind, severity = _const(keywords.get("kind")), keywords.get("severity")
            elif name in ("finding", "_finding", "emit_finding") and len(node.args) >= 2:
                kind = _const(node.args[1])
                severity = node.args[2] if len(node.args) >= 3 else keywords.get("severity")
            if kind and kind != "any":
                entry = found.setdefault(kind, {"severities": set(), "where": set()})
                entry["severities"] |= _severities(severity)
                entry["where"].add(rel)
    return found
