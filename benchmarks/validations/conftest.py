"""The long validations use the test suite's support code and fixtures (tests/ on the path)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
