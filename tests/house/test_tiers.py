"""The suite is grouped by part and tier (issue 25): tests/PART/test_*.py, and the real-server tier in
tests/real/, whose `realserver` marker the folder sets (tests/conftest.py) and nothing else does."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"


def test_every_test_module_sits_in_a_part_folder_and_only_the_real_tier_marks_itself():
    assert not list(TESTS.glob("test_*.py")), "a test module directly in tests/: put it in its part's folder"
    for path in TESTS.glob("*/test_*.py"):
        text = path.read_text()
        assert not re.search(r"mark\.realserver", text), f"{path}: the folder sets the marker, not the module"
        if path.parent.name == "real":
            assert path.name.startswith("test_real_"), path


def collected(*args: str) -> set[str]:
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return {line for line in done.stdout.splitlines() if "::" in line}


def test_the_marker_selects_the_real_folder_exactly():
    marked = collected("-m", "realserver")
    assert marked and marked == collected("tests/real")
    assert all(node.startswith("tests/real/") for node in marked)
