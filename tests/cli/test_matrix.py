"""`hitproof matrix`: one scenario per launch profile, a fresh server each, rows in DIR/matrix.json and .md."""

import json
import os
import re
from pathlib import Path

from support.cli import ROOT, report_json, run_hitproof, scenario
from tui.matrix import to_markdown

PROFILES = ROOT / "scenarios" / "profiles"
SMALL = """
[scenario]
name = "matrix-small"
phases = ["cold_hit", "rotation"]
[evidence]
memo_tokens = 400
[phases.rotation]
slots = 4
rounds = 2
memo_tokens = 400
"""


def no_server_left(pattern: str) -> None:
    """No live process whose command line matches (make the pattern specific to this test: other
    tests, and other people's servers, may run at the same time)."""
    left = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if re.search(pattern, cmd) and state not in "ZX":
                left.append(cmd)
    assert left == [], left


async def test_refserver_matrix_pass_and_fail(tmp_path):
    out = tmp_path / "m"
    result = await run_hitproof("matrix", "--profile", str(PROFILES / "refserver-none.toml"),
                                "--profile", str(PROFILES / "refserver-zero-state.toml"),
                                "--scenario", str(scenario(tmp_path, SMALL)), "--out", str(out), "--headless",
                                timeout=300)
    assert result.code == 0, result.out + result.err
    assert "[1/2] refserver-none: PASS (exit 0)" in result.out
    assert "[2/2] refserver-zero-state: FAIL (exit 1)" in result.out

    rows = json.loads((out / "matrix.json").read_text())
    assert [r["profile"] for r in rows] == ["refserver-none", "refserver-zero-state"]
    assert [(r["verdict"], r["exit_code"]) for r in rows] == [("pass", 0), ("fail", 1)]
    none, zero = rows
    assert none["cache_hits"] > 0 and none["findings"]["fail"] == 0 and none["findings"]["fail_kinds"] == []
    assert zero["findings"]["fail"] > 0 and "recall_miss" in zero["findings"]["fail_kinds"]
    for row in rows:
        assert row["log"] == str(out / f"{row['profile']}.jsonl") and Path(row["log"]).exists()
        assert row["duration_s"] > 0 and row["scenario"] == "matrix-small"
        assert set(row["phases"]) == {"cold_hit", "rotation"}
        assert row["server"]["version"].startswith("refserver-")
        assert "--fault" in row["server"]["launch_command"]
        # the row agrees with `hitproof report --format json` on its log
        report = report_json(Path(row["log"]))
        assert (report["verdict"], report["exit_code"], report["cache_hits"]) == \
            (row["verdict"], row["exit_code"], row["cache_hits"])
        assert report["incident"]["profile"]["name"] == row["profile"]
    # different servers on different ports
    assert none["server"]["launch_command"] != zero["server"]["launch_command"]

    md = (out / "matrix.md").read_text()
    assert re.search(r"refserver-none\s+PASS", md) and re.search(r"refserver-zero-state\s+FAIL", md)
    assert "| refserver-zero-state | reference server, hits restore zeros | **FAIL** | 1 |" in md
    for row in rows:
        no_server_left(re.escape(row["server"]["launch_command"]))


async def test_a_matrix_row_can_be_several_servers_behind_a_router(tmp_path):
    out = tmp_path / "m"
    result = await run_hitproof("matrix", "--profile", str(PROFILES / "refserver-replicas.toml"),
                                "--profile", str(PROFILES / "refserver-none.toml"),
                                "--scenario", str(scenario(tmp_path, SMALL)), "--out", str(out), "--headless",
                                timeout=300)
    assert result.code == 0, result.out + result.err
    rows = json.loads((out / "matrix.json").read_text())
    cluster, single = rows
    assert cluster["verdict"] == "pass" and single["verdict"] == "pass"
    assert [c["label"] for c in cluster["replicas"]] == ["r0", "r1"]
    assert all(c["hits"] > 0 for c in cluster["replicas"]) and single["replicas"] is None
    md = (out / "matrix.md").read_text()
    assert re.search(r"\| r0 \d+/\d+ r1 \d+/\d+ \|", md), md
    no_server_left("tui.refserver.router")


async def test_bad_profile_is_exit_2_before_anything_starts(tmp_path):
    bad = scenario(tmp_path, 'name = "b"\ncommand = "x {port}"\noverlays = ["missing.patch"]\n', "bad.toml")
    out = tmp_path / "m"
    result = await run_hitproof("matrix", "--profile", str(PROFILES / "refserver-none.toml"), "--profile", str(bad),
                                "--scenario", str(scenario(tmp_path, SMALL)), "--out", str(out), "--headless")
    assert result.code == 2, result.out + result.err
    assert f"{bad}:3: overlays: overlay 'missing.patch' not found" in result.err
    assert not out.exists()          # nothing launched, nothing written

    result = await run_hitproof("matrix", "--profile", str(PROFILES / "refserver-none.toml"),
                                "--profile", str(PROFILES / "refserver-none.toml"),
                                "--scenario", str(scenario(tmp_path, SMALL)), "--out", str(out), "--headless")
    assert result.code == 2 and "two profiles are named 'refserver-none'" in result.err
    result = await run_hitproof("matrix", "--profile", str(PROFILES / "refserver-none.toml"),
                                "--scenario", str(tmp_path / "nope.toml"), "--out", str(out), "--headless")
    assert result.code == 2 and "scenario file not found" in result.err
    assert not out.exists()


async def test_a_profile_that_never_serves_is_an_error_row_and_the_matrix_goes_on(tmp_path):
    marker = f"sleepy-{os.getpid()}-{tmp_path.name}"
    sleepy = scenario(tmp_path, "name = \"sleepy\"\ncommand = '''{python} -c \"print('warming up', flush=True); "
                                f"import time; time.sleep(60)\" {marker} --port {{port}}'''\nstartup_timeout = 2\n",
                      "sleepy.toml")
    out = tmp_path / "m"
    result = await run_hitproof("matrix", "--profile", str(sleepy), "--profile", str(PROFILES / "refserver-none.toml"),
                                "--scenario", str(scenario(tmp_path, SMALL)), "--out", str(out), "--headless",
                                timeout=300)
    assert result.code == 0, result.out + result.err
    rows = json.loads((out / "matrix.json").read_text())
    assert [(r["profile"], r["verdict"], r["exit_code"]) for r in rows] == \
        [("sleepy", "error", 3), ("refserver-none", "pass", 0)]
    assert "server not ready after 2s: warming up" in rows[0]["message"]
    assert rows[0]["server_tail"] == ["warming up"] and rows[0]["log"] is None
    assert "| sleepy |  | **ERROR** | 3 |" in (out / "matrix.md").read_text()
    no_server_left(re.escape(marker))
    no_server_left(re.escape(rows[1]["server"]["launch_command"]))


def test_markdown_table_shape():
    row = {"profile": "a|b", "description": "x", "verdict": "inconclusive", "exit_code": 4, "requests": 3,
           "cache_hits": 0, "findings": {"fail": 0, "warn": 1, "info": 0, "fail_kinds": [], "kinds": {"no_hits": 1}},
           "server": {"cache_reuse_forced_off": True, "cache_reuse_decided_by": "--no-enable-prefix-caching"},
           "duration_s": 12.34, "log": "d/a.jsonl", "message": "nothing failed"}
    md = to_markdown([row], "s")
    assert "| a\\|b | x | **INCONCLUSIVE** | 4 | 3 | 0 | 0/1/0 |  | yes (--no-enable-prefix-caching) |  | 12.3 |" in md
    assert "a|b       INCONCLUSIVE" in md and "- **a|b**: nothing failed" in md
