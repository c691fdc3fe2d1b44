"""`hitproof report --format junit`: one test suite with the run verdict, one case per phase and one
per check per phase, so CI shows the soak as tests. Inconclusive is skipped (not green, not red)."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from typing import Any

from ..config.phase_registry import hook
from ..log.events import Finding
from . import facts, fmt
from .facts import UNFINISHED
from .power import power_line
from .report import RunReport

# check cases: finding kind -> the request check whose presence means the check ran.
CHECK_KINDS = {"foreign_code": "foreign", "recall_miss": "recall", "empty_answer": "empty",
               "repetition": "repetition", "cache_path_divergence": None, "wrong_task": "wrong_task"}


def to_junit(report: RunReport) -> str:
    """One <testsuite name="hitproof">: the run verdict, one case per phase, one per check per phase."""
    suite = ET.Element("testsuite", name="hitproof")
    _properties(suite, report)
    _run_case(suite, report)
    findings_by_phase: dict[str, list[Finding]] = {}
    for f in facts.sorted_findings(report):
        findings_by_phase.setdefault(f.phase, []).append(f)
    for name, phase in report.phases.items():
        _phase_case(suite, report, name, phase)
        _check_cases(suite, report, name, phase, findings_by_phase.get(name, []))
    errors = [f for f in report.findings if f.kind == "server_error"]
    if errors:
        case = _case(suite, "run", "server_error")
        for f in errors:
            _outcome(case, "error", f.detail, _finding_text(f, report), type_="server_error")
    cases = suite.findall("testcase")
    suite.set("tests", str(len(cases)))
    for attr, tag in (("failures", "failure"), ("errors", "error"), ("skipped", "skipped")):
        suite.set(attr, str(sum(1 for c in cases if c.find(tag) is not None)))
    suite.set("time", f"{report.last_t:.3f}")
    if report.header is not None and report.header.started_at:
        suite.set("timestamp", report.header.started_at)
    ET.SubElement(suite, "system-out").text = _x(power_line(report))
    if report.warning:
        ET.SubElement(suite, "system-err").text = _x(f"warning: {report.warning}")
    ET.indent(suite)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"


def _properties(suite: ET.Element, report: RunReport) -> None:
    props = ET.SubElement(suite, "properties")
    server, header = report.server, report.header
    for key, value in (("verdict", report.verdict), ("exit_code", report.exit_code),
                       ("message", facts.message(report)),
                       ("run_id", header.run_id if header else None),
                       ("scenario", header.scenario.get("name") if header else None),
                       ("server.url", server.url if server else None),
                       ("server.version", server.version if server else None),
                       ("server.model", server.model if server else None),
                       ("launch_command", header.target.get("launch_command") if header else None),
                       ("warning", report.warning), ("power", power_line(report))):
        if value is not None:
            ET.SubElement(props, "property", name=key, value=_x(value))


def _run_case(suite: ET.Element, report: RunReport) -> None:
    """The run itself: an error, interruption or a log that stops early is never green."""
    verdict, case = report.verdict, _case(suite, "run", "verdict")
    summary = f"{verdict} (exit {report.exit_code}): {facts.message(report)}"
    if verdict in UNFINISHED:
        _outcome(case, "error", summary, report.warning or "", type_=verdict)
    elif verdict == "fail":
        _outcome(case, "failure", summary, type_="fail")
    elif verdict == "inconclusive":
        _outcome(case, "skipped", summary)


def _phase_case(suite: ET.Element, report: RunReport, name: str, phase: dict) -> None:
    case = _case(suite, "phase", name)
    status, reasons = phase.get("status"), "; ".join(phase.get("reasons") or [])
    if status == "fail":
        n = sum(1 for f in report.findings if f.phase == name and f.severity == "fail")
        _outcome(case, "failure", reasons or f"{n} fail-class finding(s)", type_="fail")
    elif status == "inconclusive":
        case.append(ET.Comment(" inconclusive: nothing failed, but the phase did not prove what it had to "
                               "(e.g. no hits, a failed cold baseline). It is not a pass, so not green; it is "
                               "not a fault, so not a failure: skipped is the honest mapping. "))
        _outcome(case, "skipped", reasons or "inconclusive")
    elif status != "pass":
        _outcome(case, "error", f"the phase did not finish ({status or 'no status'})", type_="unfinished")


def _check_cases(suite: ET.Element, report: RunReport, name: str, phase: dict, found: list[Finding]) -> None:
    kinds = _checks_run(report, name) | {f.kind for f in found if f.severity == "fail"} \
        | {f.kind for f in found if f.kind in CHECK_KINDS}
    kinds.discard("server_error")
    for kind in [k for k in CHECK_KINDS if k in kinds] + sorted(kinds - set(CHECK_KINDS)):
        case = _case(suite, f"check.{name}", kind)
        for f in found:
            if f.kind == kind and f.severity == "fail":
                offset = "" if f.offset is None else f" at offset {f.offset}"
                _outcome(case, "failure", f"{kind}{offset}: {f.detail}", _finding_text(f, report), type_=kind)
        related = (kind, *((hook(name, "JUNIT_RELATED") or {}).get(kind, ())))   # the phase's own notes on it
        notes = [_finding_text(f, report) for f in found if f.kind in related and f.severity != "fail"]
        skip = hook(name, "junit_skip")             # the phase can say its check could not tell
        reason = skip(phase, kind) if skip is not None else None
        if reason:
            _outcome(case, "skipped", reason)
        if notes:
            ET.SubElement(case, "system-out").text = _x(f"{len(notes)} warning/info finding(s), not failures:\n"
                                                        + "\n".join(notes))


_XML_BAD = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _x(value: Any) -> str:
    return _XML_BAD.sub("\ufffd", fmt.cell(value))


def _finding_text(f: Finding, report: RunReport) -> str:
    text = f"{f.severity.upper()} {f.kind} at {facts.where(f)}: {f.detail}"
    if f.memo:
        text += f"\nmemo: {f.memo}"
    if f.evidence:
        text += f"\nevidence: {json.dumps(f.evidence, ensure_ascii=False, default=str)}"
    iso = report.isolations.get(f.request) if f.request is not None else None
    if iso is not None:
        text += (f"\nisolation: {iso.verdict}, reproduced on {iso.reproduced}/{iso.hit_runs} hits and "
                 f"{iso.cold_reproduced}/{iso.cold_runs} cold; {iso.detail}")
    return text


def _case(suite: ET.Element, classname: str, name: str) -> ET.Element:
    return ET.SubElement(suite, "testcase", classname=classname, name=name)


def _outcome(case: ET.Element, tag: str, message: str, text: str = "", type_: str | None = None) -> None:
    element = ET.SubElement(case, tag, message=_x(message))
    if type_:
        element.set("type", type_)
    if text:
        element.text = _x(text)


def _checks_run(report: RunReport, phase: str) -> set[str]:
    """Finding kinds whose check ran on a request of this phase (a case for a check that never ran
    would be a test that cannot fail)."""
    names = report.tally.ran.get(phase, set())
    ran = {kind for kind, key in CHECK_KINDS.items() if key and key in names}
    more = hook(phase, "junit_checks")              # checks a phase runs itself, not on each request
    if more is not None:
        ran |= more(report.phases.get(phase) or {})
    return ran
