"""The two places the package looks a module up by name instead of importing it (issue 25), written down
and held: cli.py finds the commands (tui/commands/NAME.py), and core/config/phase_registry.py finds the
phases (tui/core/soak/phases/) for the scenario schema and the reports, which sit below the soak and
cannot import a phase. That lookup happens when a scenario is parsed or a report drawn, never at import
time: importing the config or the reports loads nothing of the soak."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOOKUPS = {"tui/cli.py", "tui/core/config/phase_registry.py"}


def test_modules_are_looked_up_by_name_only_in_the_two_registries():
    found = {str(p.relative_to(ROOT)) for p in (ROOT / "tui").rglob("*.py")
             if re.search(r"\bimport_module\(|__import__\(", p.read_text())}
    assert found == LOOKUPS, found ^ LOOKUPS


def test_importing_the_schema_and_the_reports_loads_no_phase():
    code = ("import sys, tui.core.config.scenario, tui.core.report.report, tui.core.report.formats; "
            "print(sorted(m for m in sys.modules if m.startswith('tui.core.soak')))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
