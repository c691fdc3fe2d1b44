"""Built-in scenarios, profiles and the embedded chat template are found after any install: the wheel
(built from a clean copy of the tree, and from the sdist) carries them as package data, and a source
checkout or an editable install finds the top-level scenarios/ folder. (.ci/run installs the wheel in a
fresh venv and runs `hitproof run --scenario quick` from another folder.)"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

from tui.core.config import builtin
from tui.core.config.scenario import load_scenario, resolve_scenario_path
from tui.core.server.profiles import load_profile, resolve_profile_path

ROOT = Path(__file__).resolve().parents[2]


def tracked(prefix: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", prefix], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if line]


def build(kind: str, source: Path, out: Path) -> Path:
    """setuptools' own PEP 517 hook, in a subprocess (it works in the current folder)."""
    name = subprocess.run([sys.executable, "-c", f"from setuptools import build_meta; "
                           f"print(build_meta.build_{kind}({str(out)!r}))"],
                          cwd=source, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    return out / name


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    """A wheel from a clean copy of the tracked files, and a wheel built from the sdist of that copy."""
    base = tmp_path_factory.mktemp("dist")
    copy = base / "tree"
    for name in tracked(".") + ["tui/app/__init__.py"]:
        source = ROOT / name
        if source.is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            (copy / name).write_bytes(source.read_bytes())
    wheel = build("wheel", copy, base / "wheel")
    sdist = build("sdist", copy, base / "sdist")
    with tarfile.open(sdist) as archive:
        archive.extractall(base / "unpacked", filter="data")
    unpacked = next((base / "unpacked").iterdir())
    from_sdist = build("wheel", unpacked, base / "from-sdist")
    return wheel, from_sdist


def wheel_files(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


def test_the_package_list_names_every_package():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {str(p.parent.relative_to(ROOT)).replace("/", ".") for p in (ROOT / "tui").rglob("*.py")
               if "__pycache__" not in p.parts}
    assert on_disk - listed == set(), "packages missing from pyproject.toml's list"
    assert {"tui.scenarios", "tui.scenarios.profiles"} <= listed


@pytest.mark.parametrize("which", ["wheel", "wheel from the sdist"])
def test_the_wheel_carries_scenarios_profiles_and_the_chat_template(dists, which):
    files = wheel_files(dists[0] if which == "wheel" else dists[1])
    expected = {"tui/" + name for name in tracked("scenarios")}
    assert expected and expected - files == set()
    assert {"tui/embedded/gemma_chat.jinja", "tui/app/app.tcss", "tui/app/__init__.py", "tui/app/app.py"} <= files
    assert not [f for f in files if f.startswith(("tests/", "benchmarks/", "scenarios/"))]


def test_names_resolve_from_any_folder_in_a_checkout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)                   # no ./scenarios here
    path = resolve_scenario_path("quick")
    assert path.is_file() and load_scenario(path).name == "quick"
    profile = resolve_profile_path("refserver-none")
    assert profile.is_file() and load_profile(profile).name == "refserver-none"
    assert builtin.builtin_folder() == ROOT / "scenarios"


def test_a_users_own_scenarios_folder_comes_first(tmp_path, monkeypatch):
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios" / "quick.toml").write_text('[scenario]\nname = "mine"\n')
    monkeypatch.chdir(tmp_path)
    assert load_scenario(resolve_scenario_path("quick")).name == "mine"


def test_an_installed_package_folder_is_preferred_when_it_exists(tmp_path, monkeypatch):
    installed = tmp_path / "site" / "tui" / "scenarios"
    installed.mkdir(parents=True)
    (installed / "quick.toml").write_text('[scenario]\nname = "installed"\n')
    monkeypatch.setattr(builtin, "INSTALLED_SCENARIOS", installed)
    monkeypatch.chdir(tmp_path)
    assert load_scenario(resolve_scenario_path("quick")).name == "installed"


def test_profiles_reference_the_chat_template_by_placeholder():
    from tui.embedded import placeholders

    template = Path(placeholders()["chat_template"]())
    assert template.is_file() and template.name == "gemma_chat.jinja"
    for name in tracked("scenarios/profiles"):
        assert "../tui/" not in (ROOT / name).read_text(), f"{name} reaches into the source tree"
    plan = load_profile(resolve_profile_path("vllm-prefix-on")).plan(port=1, placeholders=placeholders())
    assert plan.argv[plan.argv.index("--chat-template") + 1] == str(template)
