"""`hitproof setup --test-deps` (README command 2): the system packages the suite needs and pip cannot
(Debian's nginx and chromium), installed with apt-get as root or through sudo, skipped when present."""

import pytest

from tui.cli import build_parser
from tui.commands import setup, system_packages
from tui.core.config.errors import HitproofError


def _which(present: set[str]):
    return lambda name: f"/usr/bin/{name}" if name in present else None


def test_nothing_is_installed_when_both_are_on_the_path(monkeypatch):
    monkeypatch.setattr(system_packages.shutil, "which", _which({"nginx", "chromium", "apt-get"}))
    monkeypatch.setattr(system_packages.subprocess, "run", lambda *a, **k: pytest.fail("apt-get ran"))
    lines = []
    assert system_packages.install(lines.append) == []
    assert lines == ["already installed: nginx, chromium"]


def test_what_is_missing_is_installed_with_apt_get_through_sudo_when_not_root(monkeypatch):
    present = {"apt-get", "sudo", "nginx"}
    ran = []

    def run(command, **kwargs):
        ran.append(command)
        assert kwargs["env"]["DEBIAN_FRONTEND"] == "noninteractive"
        if "install" in command:
            present.add("chromium")
        return type("Done", (), {"returncode": 0, "stdout": ""})()

    monkeypatch.setattr(system_packages.shutil, "which", lambda name: f"/usr/bin/{name}" if name in present else None)
    monkeypatch.setattr(system_packages.subprocess, "run", run)
    monkeypatch.setattr(system_packages.os, "geteuid", lambda: 1000)
    assert system_packages.install(lambda line: None) == ["chromium"]
    assert ran == [["sudo", "apt-get", "update", "-qq"], ["sudo", "apt-get", "install", "-y", "-qq", "chromium"]]


def test_no_apt_get_is_one_line_naming_what_to_install(monkeypatch):
    monkeypatch.setattr(system_packages.shutil, "which", _which(set()))
    with pytest.raises(HitproofError, match="needs nginx and chromium, and this system has no apt-get"):
        system_packages.install(lambda line: None)


def test_a_failed_apt_get_is_one_line_with_its_last_output(monkeypatch):
    monkeypatch.setattr(system_packages.shutil, "which", _which({"apt-get"}))
    monkeypatch.setattr(system_packages.os, "geteuid", lambda: 0)
    monkeypatch.setattr(system_packages.subprocess, "run",
                        lambda *a, **k: type("Done", (), {"returncode": 100, "stdout": "E: Unable to locate package"})())
    with pytest.raises(HitproofError, match=r"apt-get update -qq failed \(exit 100\): E: Unable to locate package"):
        system_packages.install(lambda line: None)


def test_test_deps_alone_sets_up_no_engine(monkeypatch):
    monkeypatch.setattr(system_packages, "install", lambda progress: [])
    import tui.embedded
    monkeypatch.setattr(tui.embedded, "prepare", lambda *a, **k: pytest.fail("an engine was set up"))
    args = build_parser().parse_args(["setup", "--test-deps"])
    assert args.func(args) == 0
