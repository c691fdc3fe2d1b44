"""The core and the headless path never import Textual (checked in a fresh interpreter)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
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
