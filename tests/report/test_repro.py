"""Issue 27: `hitproof repro` writes a standalone script that reproduces a finding, and `report --format
issue` a bug report with it inline. Tested both ways on the reference server: a soak against a faulty
server, the script run with the system Python (isolated: nothing of the venv) against a fresh server
with the fault (exit 1) and without it (exit 0)."""

from __future__ import annotations

import ast
import asyncio
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.cli import ROOT, hitproof_argv, run_hitproof, scenario
from tui.refserver import start_refserver

TINY = """
[scenario]
name = "repro-tiny"
api = "completions"
phases = ["cold_hit"]
seed = 7

[evidence]
memo_tokens = 600
recall_max_tokens = 20
fingerprints = true
fingerprint_tokens = 12
fingerprint_top_k = 5
fingerprint_tolerance = 0.5

[sampling]
temperature = 0.0
seed = 1234

[phases.cold_hit]
suffix_tokens = 40
"""
SYSTEM_PYTHON = next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if Path(p).exists()),
                     shutil.which("python3") or sys.executable)


@pytest.fixture(scope="module")
def zero_log(tmp_path_factory) -> Path:
    """A one-phase soak against a server whose hits restore zeros: the hit misses its code."""
    tmp = tmp_path_factory.mktemp("repro")
    log = tmp / "zero.jsonl"

    async def soak():
        server = await start_refserver(port=0, fault="zero_state", seed=0)
        try:
            return await run_hitproof("run", "--attach", server.url, "--scenario", str(scenario(tmp, TINY)),
                                      "--headless", "--record", str(log), timeout=120)
        finally:
            await server.close()

    result = asyncio.run(soak())
    assert result.code == 1, result.out + result.err
    return log


def fails(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines() if '"severity":"fail"' in line]


def cold_hit_main(log: Path, index: int) -> int:
    """The cold_hit phase's main-arm request number `index` (0: the cold one, 1: the plain hit, 2: the hit
    with a suffix); by its place, since the run's first requests are the resume calibration's (issue 32)."""
    starts = [json.loads(line) for line in log.read_text().splitlines() if '"type":"request_start"' in line]
    return [e["request"] for e in starts if e["phase"] == "cold_hit" and e["arm"] == "main"][index]


def plain_hit(log: Path) -> int:
    """The plain hit of the cold_hit phase."""
    return cold_hit_main(log, 1)


def fail_number(log: Path, kind: str, request: int) -> str:
    """The 1-based number, among the log's fail-class findings, of the first `kind` on `request`."""
    return str(1 + next(i for i, f in enumerate(fails(log)) if f["kind"] == kind and f["request"] == request))


def hitproof(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(hitproof_argv(*args), cwd=ROOT, capture_output=True, text=True, timeout=120)


async def run_script(script: Path, fault: str, cwd: Path) -> tuple[int, str]:
    """The script, alone, with the system Python, against a fresh reference server."""
    server = await start_refserver(port=0, fault=fault, seed=0)
    try:
        proc = await asyncio.create_subprocess_exec(SYSTEM_PYTHON, "-I", str(script), server.url, cwd=cwd,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        out, _ = await asyncio.wait_for(proc.communicate(), 120)
    finally:
        await server.close()
    return proc.returncode, out.decode()


def test_repro_script_reproduces_the_fault_and_passes_without_it(zero_log, tmp_path):
    script = tmp_path / "repro.py"
    number = fail_number(zero_log, "recall_miss", plain_hit(zero_log))      # the plain hit of the cold_hit phase
    done = hitproof("repro", str(zero_log), "--finding", number, "--output", str(script))
    assert done.returncode == 0, done.stderr
    assert f"finding {number} of" in done.stderr and "recall_miss" in done.stderr
    text = script.read_text()
    imported = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)
    assert not {"tui", "httpx", "orjson"} & imported

    code, out = asyncio.run(run_script(script, "zero_state", tmp_path))
    assert code == 1, out
    assert "FAULT SHOWS on 3 of 3 hits" in out and "code" in out
    assert f"log (request {plain_hit(zero_log)})" in out      # what the log saw, next to what it sees now
    code, out = asyncio.run(run_script(script, "none", tmp_path))
    assert code == 0, out
    assert "fault no longer shows: 3 of 3 hits right" in out


def test_default_finding_is_the_first(zero_log, tmp_path):
    script = tmp_path / "first.py"
    assert hitproof("repro", str(zero_log), "--output", str(script)).returncode == 0
    first = fails(zero_log)[0]                   # request 2, the plain hit: its fingerprint, else its code
    assert f"finding 1 of {len(fails(zero_log))}: {first['kind']}" in script.read_text().splitlines()[1]
    code, out = asyncio.run(run_script(script, "zero_state", tmp_path))
    assert code == 1 and "FAULT SHOWS on 3 of 3 hits" in out, out
    if first["kind"] == "fingerprint_mismatch":
        assert "claim checked: fingerprint" in out and "fingerprint off its cold reference" in out, out
    code, out = asyncio.run(run_script(script, "none", tmp_path))
    assert code == 0, out


def test_the_script_says_one_line_on_a_connection_or_usage_error(zero_log, tmp_path):
    script = tmp_path / "repro.py"
    assert hitproof("repro", str(zero_log), "--output", str(script)).returncode == 0
    down = subprocess.run([SYSTEM_PYTHON, "-I", str(script), "http://127.0.0.1:9"], capture_output=True,
                          text=True, timeout=60)
    assert down.returncode == 2 and down.stderr.count("\n") == 1 and "repro: error:" in down.stderr
    bare = subprocess.run([SYSTEM_PYTHON, "-I", str(script)], capture_output=True, text=True, timeout=60)
    assert bare.returncode == 2 and bare.stderr.count("\n") == 1 and "URL" in bare.stderr


def test_report_format_issue_has_the_record_the_numbers_and_the_script(zero_log, tmp_path):
    number = fail_number(zero_log, "recall_miss", plain_hit(zero_log))
    done = hitproof("report", str(zero_log), "--format", "issue", "--finding", number)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert text.startswith("# recall_miss on a prefix-cache hit")
    assert "## Environment (the incident record)" in text and "refserver-0.1.0" in text
    assert "## What was ruled out" in text and "The cold control" in text
    assert "cached of" in text and "code missing" in text                       # the hit's numbers
    script = tmp_path / "repro.py"
    assert hitproof("repro", str(zero_log), "--finding", number, "--output", str(script)).returncode == 0
    assert script.read_text().rstrip() in text                                   # the same text, inline
    out = tmp_path / "issue.md"
    assert hitproof("report", str(zero_log), "--format", "issue", "--output", str(out)).returncode == 0
    assert out.read_text().startswith(f"# {fails(zero_log)[0]['kind']} ")   # the first that can be replayed
    suffix_request = cold_hit_main(zero_log, 2)
    suffix_hit = fail_number(zero_log, "recall_miss", suffix_request)      # memo + a 40-token suffix + the question
    done = hitproof("repro", str(zero_log), "--finding", suffix_hit, "--output", str(tmp_path / "y.py"))
    assert done.returncode == 2 and "is not in the log whole" in done.stderr and "these can: --finding" in done.stderr
    done = hitproof("report", str(zero_log), "--format", "issue", "--finding", suffix_hit)
    assert done.returncode == 0 and f"No standalone script for this finding: request {suffix_request}'s prompt" in done.stdout


def test_the_issue_quotes_the_servers_lines_naming_the_hit(zero_log, tmp_path):
    """Every request goes out with its own X-Request-Id; a server that names requests by it (vLLM: "cmpl-<id>",
    the reference server as well) answers under that id, and the issue quotes the launched server's lines that
    name the hit: the maintainer's way from the finding to the server's own log."""
    events = [json.loads(line) for line in zero_log.read_text().splitlines()]
    starts = {e["request"]: e for e in events if e.get("type") == "request_start"}
    ends = {e["request"]: e for e in events if e.get("type") == "request_end"}
    ids = [s["request_id"] for s in starts.values()]
    assert len(set(ids)) == len(ids) == len(ends) and all(i and i.startswith("hitproof-") for i in ids)
    assert all(ends[r]["server_id"] == "cmpl-" + starts[r]["request_id"] for r in ends)
    hit = plain_hit(zero_log)
    number = fail_number(zero_log, "recall_miss", hit)
    without = hitproof("report", str(zero_log), "--format", "issue", "--finding", number)
    assert without.returncode == 0 and "## In the server's log" in without.stdout
    assert f"`{starts[hit]['request_id']}`" in without.stdout and "kept none of the server's lines" in without.stdout
    own = f"engine: restore of request cmpl-{starts[hit]['request_id']}-0-1a2b at token 384: state zeroed"
    decoy = f"engine: request cmpl-{starts[hit]['request_id']}7-0-9f9f finished"    # request 10x, not this one
    seq = events[-1]["seq"]
    kept = tmp_path / "with-server-lines.jsonl"
    kept.write_text(zero_log.read_text() + "".join(
        json.dumps({"type": "server_log", "seq": seq + i, "t": 1.0, "line": line}) + "\n"
        for i, line in enumerate((decoy, own), 1)))
    done = hitproof("report", str(kept), "--format", "issue", "--finding", number)
    assert done.returncode == 0, done.stderr
    assert f"[request {hit}] {own}" in done.stdout and decoy not in done.stdout


def test_bad_input_is_one_line_and_exit_2(zero_log, tmp_path):
    clean = tmp_path / "clean.jsonl"
    lines = [line for line in zero_log.read_text().splitlines() if '"severity":"fail"' not in line]
    clean.write_text("\n".join(lines) + "\n")
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    cases = [
        (("repro", str(tmp_path / "missing.jsonl"), "--output", str(tmp_path / "x.py")), "cannot open log"),
        (("repro", str(text), "--output", str(tmp_path / "x.py")), "not a hitproof log"),
        (("repro", str(clean), "--output", str(tmp_path / "x.py")), "no fail-class finding"),
        (("repro", str(zero_log), "--finding", "99", "--output", str(tmp_path / "x.py")), "fail-class finding(s)"),
        (("report", str(clean), "--format", "issue"), "no fail-class finding"),
        (("report", str(text), "--format", "issue"), "not a hitproof log"),
    ]
    for args, words in cases:
        done = hitproof(*args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert words in done.stderr and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "x.py").exists()


ROTATION = """
[scenario]
name = "repro-rotation"
api = "completions"
phases = ["rotation"]
seed = 7

[evidence]
memo_tokens = 800
recall_max_tokens = 20
fingerprints = false

[sampling]
temperature = 0.0
seed = 1234

[phases.rotation]
slots = 4
rounds = 4
memo_tokens = 800
tasks = ["recall"]
"""


def test_a_leak_is_replayed_with_the_request_that_wrote_the_other_memo(tmp_path):
    """foreign_state restores, on half the hits (a seeded coin), another stored sequence: the script sends
    the request that wrote the memo whose code leaked in before the hit, and the hit 10 times."""
    log = tmp_path / "leak.jsonl"

    async def soak():
        server = await start_refserver(port=0, fault="foreign_state", seed=0)
        try:
            return await run_hitproof("run", "--attach", server.url, "--scenario",
                                      str(scenario(tmp_path, ROTATION)), "--headless", "--record", str(log),
                                      timeout=120)
        finally:
            await server.close()

    assert asyncio.run(soak()).code == 1
    first = next(f for f in fails(log) if f["kind"] == "foreign_code")
    number = fail_number(log, "foreign_code", first["request"])
    script = tmp_path / "leak.py"
    done = hitproof("repro", str(log), "--finding", number, "--repeats", "10", "--output", str(script))
    assert done.returncode == 0, done.stderr
    code, out = asyncio.run(run_script(script, "foreign_state", tmp_path))
    assert code == 1, out
    assert f"writes memo {first['evidence']['owner']}'s prefix" in out
    assert f"code {first['evidence']['code']} of memo {first['evidence']['owner']}" in out
    code, out = asyncio.run(run_script(script, "none", tmp_path))
    assert code == 0 and "10 of 10 hits right" in out, out


def test_a_log_with_fields_null_or_missing_gives_a_line_not_a_crash(zero_log, tmp_path):
    """Every optional field null (as tests/report/test_readable_output.py does for the other formats): the
    issue still renders without a raw None, and repro refuses what it cannot rebuild (exit 2, one line)."""
    events = [json.loads(line) for line in zero_log.read_text().splitlines()]
    for event in events:
        for key, value in list(event.items()):
            if key in ("type", "seq", "t", "kind", "severity", "phase", "request", "schema"):
                continue
            if isinstance(value, dict):
                event[key] = {k: None for k in value}
            elif not isinstance(value, list):
                event[key] = None
    nulled = tmp_path / "nulled.jsonl"
    nulled.write_text("".join(json.dumps(e, separators=(",", ":")) + "\n" for e in events))
    done = hitproof("report", str(nulled), "--format", "issue")
    assert done.returncode == 0, done.stderr
    assert not re.search(r"\bNone\b", done.stdout), done.stdout
    done = hitproof("repro", str(nulled), "--output", str(tmp_path / "x.py"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "can be replayed" in done.stderr, done.stderr
