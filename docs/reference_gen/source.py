"""What the reference pages read from the source besides the objects themselves: the comment that
explains each dataclass field, and the keys of the dict literals a function returns (the JSON report
is built as dict literals, so the keys are read where they are written)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import textwrap
import tokenize
from typing import Any


def _lines(src: str) -> tuple[dict[int, tuple[int, str]], set[int]]:
    """Per line: its comment (column, text) and whether it holds code."""
    comments: dict[int, tuple[int, str]] = {}
    code: set[int] = set()
    skip = {tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER,
            tokenize.COMMENT, tokenize.ENCODING}
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = (tok.start[1], tok.string.lstrip("#").strip())
        elif tok.type not in skip:
            for line in range(tok.start[0], tok.end[0] + 1):
                code.add(line)
    return comments, code


def _class_comments(cls: type) -> dict[str, str]:
    try:
        src = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    comments, code = _lines(src)
    tree = ast.parse(src).body[0]
    out: dict[str, str] = {}
    for node in getattr(tree, "body", []):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        line, indent = node.lineno, node.col_offset
        above: list[str] = []
        n = line - 1
        while n in comments and n not in code and comments[n][0] == indent:
            above.insert(0, comments[n][1])
            n -= 1
        after: list[str] = []
        if line in comments:
            after.append(comments[line][1])
            n = node.end_lineno + 1
            while n in comments and n not in code and comments[n][0] > indent:
                after.append(comments[n][1])
                n += 1
        text = " ".join(part for part in above + after if part)
        if text:
            out[node.target.id] = text
    return out


def field_comments(cls: type) -> dict[str, str]:
    """Each field's comment, the class's own over its bases': the comment-only lines at the field's
    indentation just above it, then its trailing comment and the comment lines that continue it."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            out.update(_class_comments(klass))
    return out


def type_name(f: dataclasses.Field) -> str:
    t = f.type
    return t if isinstance(t, str) else getattr(t, "__name__", repr(t))


def default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:          # type: ignore[misc]
        return f.default_factory()                             # type: ignore[misc]
    return dataclasses.MISSING


def toml_value(value: Any) -> str:
    """A default as a scenario file writes it."""
    if value is dataclasses.MISSING:
        return "(required)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '""' if not value else f'"{value}"'
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{}" if not value else "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"
    if value is None:
        return "none"
    return repr(value)


def json_value(value: Any) -> str:
    if value is dataclasses.MISSING:
        return "(required)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(json_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{}" if not value else "{...}"
    return repr(value)


def returned_dict_keys(func: Any) -> list[tuple[str, list[str]]]:
    """The keys of the dict literal(s) a function returns, nested ones as dotted paths:
    [(key path, [sub keys])] in source order; `**{...}` spread into a dict counts as its keys."""
    src = textwrap.dedent(inspect.getsource(func))
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Dict):
            _walk_dict(node.value, "", found)
            break
    return found


def dict_keys(node: ast.Dict) -> list[str]:
    keys: list[str] = []
    for key, value in zip(node.keys, node.values):
        if key is None:                                    # **spread
            for sub in ast.walk(value):
                if isinstance(sub, ast.Dict):
                    keys += dict_keys(sub)
                    break
        elif isinstance(key, ast.Constant) and isinstance(key.value, str):
            keys.append(key.value)
    return keys


def _walk_dict(node: ast.Dict, prefix: str, found: list[tuple[str, list[str]]]) -> None:
    found.append((prefix, dict_keys(node)))
    for key, value in zip(node.keys, node.values):
        if key is None:
            continue
        if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
            continue
        path = f"{prefix}.{key.value}" if prefix else key.value
        target = value if isinstance(value, ast.Dict) else \
            next((sub for sub in ast.walk(value) if isinstance(sub, ast.Dict)), None)
        if target is not None and dict_keys(target):
            _walk_dict(target, path, found)


def assigned_keys(func: Any, name: str) -> list[str]:
    """The string keys a function assigns into `name[...]` (`data["power"] = ...`)."""
    src = textwrap.dedent(inspect.getsource(func))
    keys = []
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) \
                        and target.value.id == name and isinstance(target.slice, ast.Constant):
                    keys.append(target.slice.value)
    return keys


def cell(text: Any) -> str:
    """Text that is safe inside a markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def assigned_dict_keys(func: Any, name: str) -> list[str]:
    """The keys of the first dict literal a function assigns to `name` (`summary = {...}`)."""
    src = textwrap.dedent(inspect.getsource(func))
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict) and any(
                isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return dict_keys(node.value)
    return []


def subscript_keys(func: Any, name: str) -> list[str]:
    """Keys a function adds to `name` after building it (`summary["x"] = ...`, `name.update(...)` aside)."""
    return assigned_keys(func, name)
