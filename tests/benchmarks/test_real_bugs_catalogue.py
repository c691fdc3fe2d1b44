"""benchmarks/real_bugs.py and its catalogue benchmarks/real_bugs.md stay one list (issue 27): `--list` prints
every case and exits 0 without touching a server, and the catalogue has one numbered section per case the
script knows, named in the section's heading, and none it does not."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEADING = re.compile(r"^## \d+\. .*\(`([a-z0-9-]+)`\)$", re.M)


def test_list_prints_every_case_and_the_catalogue_names_each_one():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "real_bugs.py"), "--list"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line.split("\t") for line in done.stdout.splitlines() if line.strip()]
    names = [row[0] for row in rows]
    assert len(names) >= 5 and len(set(names)) == len(names), names
    for row in rows:                  # name, engine, finding kind, caught by, control, time, upstream
        assert len(row) == 7 and all(row), row
        assert row[6].startswith(("known:", "related:", "not found upstream: new")), row

    catalogue = (ROOT / "benchmarks" / "real_bugs.md").read_text()
    assert HEADING.findall(catalogue) == names           # the same cases, in the same order
    for row in rows:                                     # each summary row names the case and its finding
        summary = next((line for line in catalogue.splitlines() if line.startswith(f"| `{row[0]}` |")), None)
        assert summary is not None and f"`{row[2]}`" in summary, row[0]


def test_each_kept_repro_script_is_a_standalone_script_of_a_catalogued_case():
    """benchmarks/real_bugs_repro/CASE.py.gz: the scripts real_bugs.py wrote and ran against the real servers;
    each names a case of the catalogue, imports the standard library only, and compiles."""
    import ast
    import gzip

    kept = sorted((ROOT / "benchmarks" / "real_bugs_repro").glob("*.py.gz"))
    catalogue = (ROOT / "benchmarks" / "real_bugs.md").read_text()
    assert len(kept) >= 5
    for path in kept:
        case = path.name.removesuffix(".py.gz")
        assert f"(`{case}`)" in catalogue and (path.parent / f"{case}.bug.out").is_file(), case
        tree = ast.parse(gzip.decompress(path.read_bytes()).decode())
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert imported <= set(sys.stdlib_module_names), (case, imported - set(sys.stdlib_module_names))
        assert "FAULT SHOWS" in (path.parent / f"{case}.bug.out").read_text(), case
