"""Report formats from real soak logs (recorded here against the in-process reference server) and
from hand-built event lists for the edge cases: JUnit, markdown, text."""

import asyncio
import re
import xml.etree.ElementTree as ET

import pytest

from tui.core.soak.engine import Target
from tui.core.log.events import (Finding, IsolationFinished, PhaseFinished, PhaseStarted, RequestFinished,
                                 RequestStarted, RunFinished, RunHeader, ServerInfo)
from tui.core.report.formats import to_junit, to_markdown
from tui.headless import report_text as to_text
from tui.core.report.power import power_json, power_line
from tui.core.log.reader import read_log
from tui.core.report.report import RunReport
from tui.core.config.scenario import parse_scenario
from tui.refserver import start_refserver
from tui.runner import run

SCENARIO = """
[scenario]
name = "formats"
phases = ["cold_hit", "shared_concurrency", "rotation", "determinism", "control"]
[evidence]
memo_tokens = 400
[phases.shared_concurrency]
streams = 4
rounds = 1
[phases.rotation]
slots = 4
rounds = 3
memo_tokens = 300
[phases.determinism]
max_tokens = 48
short_memo_tokens = 200
short_runs = 3
[phases.control]
requests = 2
"""
FAULTS = ("foreign_state", "none", "wording_drift")


async def _record(fault: str, path) -> None:
    handle = await start_refserver(port=0, fault=fault, drift_min_tokens=200)
    try:
        await run(parse_scenario(SCENARIO), Target(url=handle.url), record=path, isolate=True)
    finally:
        await handle.close()


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    """One real log per fault, recorded concurrently (a few seconds in all)."""
    folder = tmp_path_factory.mktemp("logs")
    paths = {fault: folder / f"{fault}.jsonl" for fault in FAULTS}

    async def record_all():
        await asyncio.gather(*(_record(fault, path) for fault, path in paths.items()))

    asyncio.run(record_all())
    return paths


def _load(path) -> RunReport:
    log = read_log(path)
    return RunReport.from_events(log.events, warning=log.warning)


def _suite(xml: str) -> ET.Element:
    suite = ET.fromstring(xml)
    assert suite.tag == "testsuite" and suite.get("name") == "hitproof"
    cases = suite.findall("testcase")
    # the suite's counts are the cases' outcomes, recounted
    assert int(suite.get("tests")) == len(cases)
    for attr, tag in (("failures", "failure"), ("errors", "error"), ("skipped", "skipped")):
        assert int(suite.get(attr)) == sum(1 for c in cases if c.find(tag) is not None), attr
    return suite


def _check_failures(suite: ET.Element) -> list[ET.Element]:
    return [f for c in suite.findall("testcase") if c.get("classname", "").startswith("check.")
            for f in c.findall("failure")]


def _green(suite: ET.Element) -> bool:
    return suite.get("failures") == "0" and suite.get("errors") == "0"


# --- real logs -------------------------------------------------------------------------------

def test_junit_fails_exactly_for_fail_class_findings(logs):
    report = _load(logs["foreign_state"])
    fails = [f for f in report.findings if f.severity == "fail"]
    assert {f.kind for f in fails} >= {"foreign_code"} and report.verdict == "fail"
    suite = _suite(to_junit(report))
    failures = _check_failures(suite)
    assert len(failures) == len(fails)
    assert sorted(f.get("type") for f in failures) == sorted(f.kind for f in fails)
    for f in fails:      # each failure sits in the case of its phase and kind, with its offset
        case = suite.find(f"testcase[@classname='check.{f.phase}'][@name='{f.kind}']")
        assert case is not None
        texts = [x.text for x in case.findall("failure")]
        assert any(f"request {f.request}" in t for t in texts)
        if f.offset is not None:
            assert any(f"offset {f.offset}" in x.get("message") for x in case.findall("failure"))
    rotation = suite.find("testcase[@classname='phase'][@name='rotation']")
    assert rotation.find("failure") is not None
    assert suite.find("testcase[@classname='run'][@name='verdict']/failure") is not None
    # isolation verdicts travel with the failure they re-ran
    assert any("isolation: leak" in (x.text or "") for x in failures)
    phases = {c.get("name") for c in suite.findall("testcase[@classname='phase']")}
    assert phases == set(report.phases)


def test_junit_of_a_clean_run_is_green(logs):
    report = _load(logs["none"])
    assert report.verdict == "pass"
    suite = _suite(to_junit(report))
    assert _green(suite) and suite.get("skipped") == "0"
    assert not _check_failures(suite)
    names = {(c.get("classname"), c.get("name")) for c in suite.findall("testcase")}
    assert ("check.rotation", "foreign_code") in names and ("check.determinism", "cache_path_divergence") in names
    # a check that could not fire is not reported as a passing test: one code only, nothing foreign to see
    assert ("check.cold_hit", "foreign_code") not in names
    assert suite.find("system-out").text == power_line(report)


def test_junit_of_wording_drift_has_no_failures(logs):
    report = _load(logs["wording_drift"])
    assert report.verdict == "pass"
    assert {f.severity for f in report.findings} <= {"warn", "info"} and report.findings
    suite = _suite(to_junit(report))
    assert _green(suite) and not _check_failures(suite)
    det = suite.find("testcase[@classname='check.determinism'][@name='cache_path_divergence']")
    assert det.find("skipped") is not None          # kernel nondeterminism: hit vs cold cannot tell
    assert "kernel_nondeterminism" in det.find("system-out").text
    for f in report.findings:
        if f.kind == "wrong_task":
            case = suite.find(f"testcase[@classname='check.{f.phase}'][@name='wrong_task']")
            assert case.find("failure") is None and "WARN wrong_task" in case.find("system-out").text


def test_markdown_lists_findings_by_kind_with_offsets(logs):
    report = _load(logs["foreign_state"])
    md = to_markdown(report)
    assert md.startswith("## hitproof: FAIL (exit 1)")
    rows = [line for line in md.splitlines() if line.startswith("| fail |")]
    fails = [f for f in report.findings if f.severity == "fail"]
    assert len(rows) == len(fails)
    for f in fails:
        cells = f"| fail | `{f.kind}` | {f.phase} | {'-' if f.slot is None else f.slot} | " \
                f"{'-' if f.round is None else f.round} | {f.request} | {'-' if f.offset is None else f.offset} |"
        assert any(row.startswith(cells) for row in rows), cells
    # fail first, then warn and info
    severities = [line.split("|")[1].strip() for line in md.splitlines()
                  if re.match(r"\| (fail|warn|info) \|", line)]
    assert severities == sorted(severities, key=["fail", "warn", "info"].index)
    for needle in ("### Phases", "| rotation | fail |", "refserver", "cache config", "block_size=16",
                   "### Isolation re-runs", "leak", "### Statistical power", "checked for foreign codes",
                   "76 rotation rounds", "TTFT", "determinism: "):
        assert needle in md, needle


def test_markdown_and_text_of_a_clean_run(logs):
    report = _load(logs["none"])
    md, text = to_markdown(report), to_text(report)
    assert "## hitproof: PASS (exit 0)" in md and "None." in md
    assert "\x1b" not in text and "verdict: PASS (exit 0)" in text
    assert power_line(report)[:60] in text and "hits checked for foreign codes" in text
    assert "server " in text and "refmodel" in text
    assert "power" not in report.to_json()                   # the lead adds power_json under "power"
    assert power_json(report)["evidence"]["foreign"]["failures"] == 0


def test_text_of_a_failed_run_has_no_escape_codes(logs):
    text = to_text(_load(logs["foreign_state"]))
    assert "\x1b" not in text and "verdict: FAIL (exit 1)" in text and "foreign_code" in text


def test_truncated_log_warns_in_every_format_and_is_never_green(logs, tmp_path):
    lines = logs["foreign_state"].read_text(encoding="utf-8").splitlines(keepends=True)
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(lines[: len(lines) // 2]) + lines[len(lines) // 2][:25], encoding="utf-8")
    log = read_log(cut)
    assert log.warning
    report = RunReport.from_events(log.events, warning=log.warning)
    flat = lambda s: " ".join(s.split())   # noqa: E731  (the console wraps at 120 columns)
    assert flat(log.warning) in flat(to_text(report))
    assert log.warning in to_markdown(report)
    suite = _suite(to_junit(report))
    assert suite.find("properties/property[@name='warning']").get("value") == log.warning
    assert log.warning in suite.find("system-err").text
    assert not _green(suite)
    verdict = suite.find("testcase[@classname='run'][@name='verdict']")
    assert verdict.find("error") is not None or verdict.find("failure") is not None


# --- hand-built edge cases --------------------------------------------------------------------

def _events(*tail):
    return [RunHeader(seq=1, run_id="r1", scenario={"name": "hand", "settings": {"seed": 3}},
                      target={"url": "http://x", "launch_command": "vllm serve m --enable-prefix-caching"}),
            ServerInfo(seq=2, url="http://x", dialect="vllm", version="0.9.1", model="m", grid=1600,
                       grid_source="server", cache_config={"block_size": "1600"}),
            PhaseStarted(seq=3, phase="rotation", planned_requests=8),
            RequestStarted(seq=4, request=1, phase="rotation", code="1111-2222-3333", arm="main", expect="cold"),
            RequestFinished(seq=5, request=1, phase="rotation", cached_tokens=0,
                            checks={"foreign": [], "recall": {}, "empty": False}),
            *tail]


@pytest.mark.parametrize("verdict,code", [("interrupted", 130), ("error", 3)])
def test_an_unfinished_run_is_never_green(verdict, code):
    tail = [Finding(seq=6, kind="server_error", severity="fail", phase="rotation", detail="HTTP 500 from the server")] \
        if verdict == "error" else []
    tail += [PhaseFinished(seq=7, phase="rotation", status="fail" if tail else "inconclusive",
                           reasons=["stopped"]),
             RunFinished(seq=8, verdict=verdict, exit_code=code, message="stopped")]
    report = RunReport.from_events(_events(*tail))
    suite = _suite(to_junit(report))
    assert not _green(suite)
    assert suite.find("testcase[@classname='run'][@name='verdict']/error").get("type") == verdict
    if verdict == "error":
        assert suite.find("testcase[@classname='run'][@name='server_error']/error").get("message") == \
            "HTTP 500 from the server"
        assert not _check_failures(suite)                 # a server error is an error, not a check failure
    assert f"{verdict.upper()} (exit {code})" in to_markdown(report)


def test_a_phase_that_never_finished_is_an_error():
    report = RunReport.from_events(_events())             # no PhaseFinished, no RunFinished
    suite = _suite(to_junit(report))
    assert suite.find("testcase[@classname='phase'][@name='rotation']/error") is not None
    assert suite.find("testcase[@classname='run'][@name='verdict']/error").get("type") == "incomplete"
    assert "INCOMPLETE" in to_markdown(report)


def test_inconclusive_phase_is_skipped_with_its_reasons():
    report = RunReport.from_events(_events(
        Finding(seq=6, kind="no_hits", severity="warn", phase="rotation", request=1, detail="no hit"),
        PhaseFinished(seq=7, phase="rotation", status="inconclusive", reasons=["no cache hits where hits were required"]),
        RunFinished(seq=8, verdict="inconclusive", exit_code=4, message="nothing proven")))
    xml = to_junit(report)
    suite = _suite(xml)
    skipped = suite.find("testcase[@classname='phase'][@name='rotation']/skipped")
    assert skipped.get("message") == "no cache hits where hits were required"
    assert "honest mapping" in xml                        # the comment says why skipped
    assert _green(suite) is True and suite.get("skipped") == "2"   # phase and run verdict; nothing failed
    md = to_markdown(report)
    assert "| rotation | inconclusive |" in md and "- rotation: no cache hits where hits were required" in md


def test_wrong_task_warning_passes_and_details_are_escaped():
    nasty = "answered the code | not a summary\nline two \x00\x07"
    report = RunReport.from_events(_events(
        RequestStarted(seq=6, request=2, phase="rotation", code="4444-5555-6666", task="summary", expect="hit"),
        RequestFinished(seq=7, request=2, phase="rotation", cached_tokens=800, checks={"foreign": [], "wrong_task": {}}),
        Finding(seq=8, kind="wrong_task", severity="warn", phase="rotation", slot=1, round=2, request=2, offset=7,
                detail=nasty),
        Finding(seq=9, kind="foreign_code", severity="fail", phase="rotation", slot=1, round=2, request=2, offset=40,
                detail="answer carries code 1111-2222-3333 owned by memo m1 at offset 40"),
        IsolationFinished(seq=10, request=2, kind="foreign_code", verdict="leak", k=4, hit_runs=4, cold_runs=4,
                          reproduced=0, cold_reproduced=0, detail="only under concurrency (0/4 hits)"),
        PhaseFinished(seq=11, phase="rotation", status="fail"),
        RunFinished(seq=12, verdict="fail", exit_code=1, message="1 fail-class finding(s)")))
    suite = _suite(to_junit(report))                       # control characters do not break the XML
    wrong = suite.find("testcase[@classname='check.rotation'][@name='wrong_task']")
    assert wrong.find("failure") is None and "WARN wrong_task" in wrong.find("system-out").text
    foreign = suite.find("testcase[@classname='check.rotation'][@name='foreign_code']")
    assert len(foreign.findall("failure")) == 1 and "offset 40" in foreign.find("failure").get("message")
    assert "0/4 hits" in foreign.find("failure").text
    md = to_markdown(report)
    assert "answered the code \\| not a summary line two" in md
    assert md.index("| fail | `foreign_code`") < md.index("| warn | `wrong_task`")
    assert "| 2 | `foreign_code` | leak | 0/4 | 0/4 |" in md
    assert "vllm serve m --enable-prefix-caching" in md and "0.9.1" in md and "1600 tokens (server)" in md
