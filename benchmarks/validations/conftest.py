"""The long validations use the test suite's support code and fixtures (tests/ on the path)."""

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2] / "tests"
# the suite's support code, and its test modules by name (tests/PART/test_*.py)
sys.path[:0] = [str(TESTS)] + sorted(str(d) for d in TESTS.iterdir() if d.is_dir() and d.name not in
                                     ("support", "fixtures", "__pycache__"))
