"""The manual (docs/, built by MkDocs) and the front page (README.md) say what the code does (issue 35):
the reference pages are generated from the code and must match it, every key and kind they list has a
meaning, `--help` says what the manual says, the README's links resolve, and the screenshot script
covers every picture the pages show."""

import argparse
import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_reference", DOCS / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_generated_reference_pages_match_the_code():
    stale = _generator().stale()
    assert stale == [], f"stale: {stale}: run `python docs/gen_reference.py` and commit the pages"


def test_every_scenario_key_json_key_and_finding_kind_has_a_meaning():
    _generator()
    from reference_gen import json_page, scenario_page
    assert scenario_page.missing_meanings() == [], "write a comment on the key's Settings line"
    assert json_page.undescribed() == [], "give it a line in docs/reference_gen/meanings.py"


def test_a_new_settings_key_shows_up_with_its_comment_and_minimum(monkeypatch):
    import dataclasses
    _generator()
    from reference_gen import scenario_page
    from tui.core.config.phase_registry import registry
    module = registry()["rotation"]

    @dataclasses.dataclass(frozen=True)
    class Settings(module.Settings):
        spin: int = 3                    # how many times each slot spins

    monkeypatch.setattr(module, "Settings", Settings)
    monkeypatch.setattr(module, "MINIMUMS", {**module.MINIMUMS, "spin": 2})
    row = next(line for line in scenario_page.page().splitlines() if line.startswith("| `spin`"))
    assert row == "| `spin` | `int` | `3` | 2 | how many times each slot spins |"


def _normal(text: str) -> str:
    return " ".join(text.replace("\\|", "|").split())


def test_help_says_what_the_manual_says():
    from tui.cli import build_parser
    page = _normal((DOCS / "reference" / "cli.md").read_text())
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert _normal(parser.description) in page
    for name, command in sub.choices.items():
        assert f"## `hitproof {name}`" in page
        for action in command._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            for option in action.option_strings:
                assert f"`{option}`" in page, (name, option)
            if action.help:
                assert _normal(action.help.replace("%%", "%")) in page, (name, action.help)


def test_readme_is_a_front_page_whose_links_resolve():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 160
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if not re.match(r"[a-z]+://", link)]
    assert local, "the README links into the manual"
    for link in local:
        assert (ROOT / link).exists(), link
    for page in ("docs/attach.md", "docs/verdicts.md", "docs/ci.md"):
        assert page in local, f"the README links to {page} (two clicks to attach, INCONCLUSIVE, CI)"


def test_readme_commands_install_what_the_suite_needs():
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Two commands\n+```bash\n(.*?)```", text, re.S).group(1)
    commands = [line for line in block.splitlines() if line and not line.startswith("#")]
    # both tiers: the fast one on two workers, then the real-server one a test at a time
    assert commands[1] == (".venv/bin/hitproof setup --test-deps && .venv/bin/python -m pytest -m \"not realserver\" "
                           "-n 2 && .venv/bin/python -m pytest -m realserver")
    ci = (ROOT / ".ci" / "run").read_text()
    for command in commands:
        assert f"\n{command}\n" in ci, f".ci/run runs the README's command as written: {command}"


def test_every_manual_page_is_in_the_nav_and_every_screenshot_is_regenerated():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md") if "reference_gen" not in p.parts)
    for page in pages:
        assert page in nav, f"{page} is not in mkdocs.yml's nav"
    spec = importlib.util.spec_from_file_location("screenshots_script", DOCS / "screenshots.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    for name, node in script.SHOTS.items():
        path, test = node.split("::")
        source = (ROOT / path).read_text()
        assert f"def {test}(" in source and f'"{name}"' in source, f"{node} does not write {name}"
    shown = set(re.findall(r"screenshots/([\w.-]+\.(?:svg|png))", "".join(
        p.read_text() for p in [ROOT / "README.md", *DOCS.rglob("*.md")])))
    assert shown
    for name in shown:
        assert (ROOT / "screenshots" / name).exists(), name
        assert name in script.SHOTS, f"docs/screenshots.py does not say which test renders {name}"


def test_the_exit_code_table_holds_every_exit_code():
    from tui.core.config import errors
    codes = {value for name, value in vars(errors).items() if name.startswith("EXIT_")}
    table = (DOCS / "reference" / "exit-codes.md").read_text()
    readme = (ROOT / "README.md").read_text()
    for code in codes:
        assert re.search(rf"^\| {code} \|", table, re.M), code
        assert re.search(rf"^\| {code} \|", readme, re.M), f"README's exit-code table lacks {code}"
