"""Smoke test of the benchmark runner: `benchmarks/run.py --quick` runs every section at small sizes
and prints each figure with its baseline and ratio. Nothing here asserts a timing: the figures
depend on the machine (benchmarks/RESULTS.md has them)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = {"fidelity", "throughput", "ui", "replay", "memory"}


def test_quick_run_prints_every_figure_with_its_baseline_and_ratio(tmp_path):
    results = tmp_path / "results.json"
    table = tmp_path / "results.md"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", "--json", str(results),
                           "--markdown", str(table)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = json.loads(results.read_text())["rows"]
    assert {row["section"] for row in rows} == SECTIONS
    printed = [line for line in done.stdout.splitlines() if line.startswith("[") and " | baseline " in line]
    assert len(printed) == len(rows)
    for row, line in zip(rows, printed):
        assert isinstance(row["value"], (int, float)) and isinstance(row["baseline"], (int, float))
        assert row["baseline_name"] and row["target"]
        assert line.startswith(f"[{row['section']}] {row['figure']}: ")
        assert f" | baseline {row['baseline_name']} " in line and " | ratio " in line and " | target " in line
        assert line.split(" | ratio ")[1].split(" ")[0] == ("-" if row["ratio"] is None else f"{row['ratio']:.3g}")
    for section in SECTIONS:                  # every section compares against something
        assert any(row["ratio"] is not None for row in rows if row["section"] == section), section
    assert table.read_text().count("\n") == len(rows) + 2
    assert "done in" in done.stdout
