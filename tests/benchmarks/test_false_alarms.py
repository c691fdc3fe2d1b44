"""The false-alarm benchmark (benchmarks/false_alarms.py) on the reference server, and the field it reads
from fingerprint events (`second`, added for it): logs written before it still load."""

import json
import subprocess
import sys
from pathlib import Path

from tui.core.checks.detectors import SPIKE_FACTOR
from tui.core.log.events import FingerprintCompared, decode, encode

ROOT = Path(__file__).resolve().parents[2]


def test_a_fingerprint_line_from_before_the_second_field_still_decodes():
    old = ('{"type": "fingerprint", "seq": 12, "t": 1.08, "request": 2, "own_request": 1, "verdict": "match", '
           '"agreeing": 12, "distance": 0.049803, "closest": null}')
    event = decode(old)
    assert isinstance(event, FingerprintCompared) and event.distance == 0.049803 and event.second == 0.0
    new = FingerprintCompared(request=3, own_request=1, verdict="match", agreeing=12, distance=0.4, second=0.2)
    assert decode(encode(new)) == new


def test_one_clean_soak_on_the_reference_server_gives_rows_and_no_fail(tmp_path):
    out = tmp_path / "json.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "false_alarms.py"), "--engines", "refserver",
                           "--soaks", "1", "--out", str(tmp_path), "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and "| refserver |" in line]
    assert any(line.startswith("| fingerprint 2nd-largest |") for line in rows), done.stdout
    assert "FAIL verdicts: 0, ERROR verdicts: 0" in done.stdout
    data = json.loads(out.read_text())
    assert data["verdicts"] == {"pass": 1}
    (engine,) = data["engines"]
    assert engine["status"] == "ran" and len(engine["soaks"]) == 1
    combined = {row["check"]: row for row in engine["combined"]}
    largest = combined["fingerprint largest"]
    assert largest["comparisons"] > 0 and largest["fired"] == 0
    assert largest["threshold"] == SPIKE_FACTOR * engine["soaks"][0]["tolerance"]     # the code's constant
    assert combined["cold->hit TTFT hit/cold"]["comparisons"] == 1
    assert engine["soaks"][0]["checked"]["second_field_absent_or_differs"] == 0      # the logged field is the judge's
