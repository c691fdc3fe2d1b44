"""Report renderers over a RunReport: plain text, markdown for a bug report, JUnit XML for CI.

JSON stays RunReport.to_json(); power.power_json() is its "power" object. Pure: strings out.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from typing import Any

from ..log.events import Finding
from . import fmt
from .latency import ARMS, STAT_KEYS
from .power import KINDS, evidence_counts, power_line, rotation_slots, sizing_sentence
from .report import RunReport

SEVERITY_ORDER = {"fail": 0, "warn": 1, "info": 2}
# JUnit check cases: finding kind -> the request check whose presence means the check ran.
CHECK_KINDS = {"foreign_code": "foreign", "recall_miss": "recall", "empty_answer": "empty",
               "repetition": "repetition", "cache_path_divergence": None, "wrong_task": "wrong_task"}
UNFINISHED = ("error", "interrupted", "incomplete")


# --- shared facts --------------------------------------------------------------------------

def _message(report: RunReport) -> str:
    return report.end.message if report.end else "the log ends before the run did"


def _where(f: Finding) -> str:
    parts = [f.phase or "run"]
    for label, value in (("slot", f.slot), ("round", f.round), ("request", f.request), ("offset", f.offset)):
        if value is not None:
            parts.append(f"{label} {value}")
    return ", ".join(parts)


def _sorted_findings(report: RunReport) -> list[Finding]:
    return sorted(report.findings, key=lambda f: (SEVERITY_ORDER.get(f.severity, 3), f.seq))


def _counts(report: RunReport, phase: str) -> dict[str, int]:
    counts = {"fail": 0, "warn": 0, "info": 0}
    for f in report.findings:
        if f.phase == phase and f.severity in counts:
            counts[f.severity] += 1
    return counts


def _settings(report: RunReport) -> dict[str, Any]:
    return ((report.header.scenario if report.header else None) or {}).get("settings") or {}


def _sampling(report: RunReport) -> dict[str, Any]:
    target = report.header.target if report.header else {}
    return (target or {}).get("sampling") or _settings(report).get("sampling") or {}


def _ttft_lines(report: RunReport) -> list[str]:
    lines = []
    for name, phase in report.phases.items():
        cold, hit, cut = phase.get("ttft_cold_ms"), phase.get("ttft_hit_ms"), phase.get("ttft_cut_pct")
        if cut is None:
            continue
        size = f" ({phase['prompt_tokens']} prompt tokens)" if name == "long_prompt" and phase.get("prompt_tokens") else ""
        lines.append(f"{name}{size}: TTFT {fmt.ms(cold)} ms cold -> {fmt.ms(hit)} ms hit ({cut}% cut)")
    return lines


def _determinism_line(report: RunReport) -> str | None:
    d = (report.phases.get("determinism") or {}).get("determinism")
    if not d:
        return None
    off = lambda v: "none" if v is None else f"char {v}"   # noqa: E731
    return (f"determinism: {d.get('kind')} (first divergence: hit vs cold {off(d.get('hit_vs_cold'))}, hit vs hit "
            f"{off(d.get('hit_vs_hit'))}, cold vs cold {off(d.get('cold_vs_cold'))}, short cold control "
            f"{off(d.get('short_control'))})")


# --- markdown ------------------------------------------------------------------------------

def _md(value: Any) -> str:
    return fmt.cell(value).replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def _row(*cells: Any) -> str:
    return "| " + " | ".join(_md(c) for c in cells) + " |"


def _table(headers: list[str], rows: list[list[Any]]) -> list[str]:
    return [_row(*headers), "|" + "|".join("---" for _ in headers) + "|"] + [_row(*r) for r in rows]


def to_markdown(report: RunReport) -> str:
    """A bug-report paste: verdict, server and run facts, phases, timing, findings, isolation, power."""
    verdict = report.verdict
    lines = [f"## hitproof: {verdict.upper()} (exit {report.exit_code})", "",
             f"{_message(report)}; {len(report.starts)} requests, {report.cache_hits()} cache hits, "
             f"{report.last_t:.1f} s.", ""]
    if report.warning:
        lines += [f"> **Warning:** {report.warning}", ""]

    header, server = report.header, report.server
    target = (header.target if header else None) or {}
    facts: list[list[Any]] = []
    if server is not None:
        facts += [["URL", server.url], ["dialect", server.dialect], ["server version", server.version or "unknown"],
                  ["model", server.model], ["grid", f"{server.grid} tokens ({server.grid_source})"],
                  ["tokenizer", server.tokenizer], ["cold requests forced by", server.salts or "unknown"],
                  ["cache config", fmt.kv(server.cache_config) or "unknown"]]
    elif target.get("url"):
        facts.append(["URL", target["url"]])
    facts.append(["launch command", target.get("launch_command") or "attached (not launched by hitproof)"])
    if target.get("env"):
        facts.append(["environment", fmt.kv(target["env"])])
    if header is not None:
        facts += [["scenario", f"{header.scenario.get('name')} ({header.scenario.get('source')}, sha256 "
                               f"{str(header.scenario.get('sha256') or '')[:12]})"],
                  ["seed", _settings(report).get("seed")], ["sampling", fmt.kv(_sampling(report)) or "default"],
                  ["cache reuse forced off", "yes" if target.get("cache_reuse_forced_off") else "no"],
                  ["run", f"{header.run_id}, started {header.started_at}"],
                  ["hitproof", f"{header.tool.get('version')} (python {header.tool.get('python')})"],
                  ["command", " ".join(header.tool.get("argv") or [])]]
    lines += ["### Server and run", ""] + _table(["", ""], facts) + [""]
    lines += incident_markdown(report)

    rows = []
    for name, phase in report.phases.items():
        c = _counts(report, name)
        rows.append([name, phase.get("status", "?"), phase.get("requests"), phase.get("hits"),
                     phase.get("hits_proven") or "per request", phase.get("cached_tokens"),
                     fmt.ms(phase.get("ttft_cold_ms")), fmt.ms(phase.get("ttft_hit_ms")), f"{c['fail']}/{c['warn']}/{c['info']}"])
    lines += ["### Phases", ""] + _table(["phase", "status", "requests", "hits", "hits proven", "cached tokens",
                                          "TTFT cold ms", "TTFT hit ms", "findings f/w/i"], rows) + [""]
    target = report.power_target
    if target is not None:
        lines += [f"**Power target:** {target.sentence}.", ""]
    reasons = [f"- {name}: {r}" for name, phase in report.phases.items() for r in phase.get("reasons") or []]
    if reasons:
        lines += reasons + [""]
    timing = _ttft_lines(report) + [x for x in [_determinism_line(report)] if x]
    if timing:
        lines += ["### Timing and determinism", ""] + [f"- {t}" for t in timing] + [""]
    lines += ttft_markdown(report)

    ordered = _sorted_findings(report)
    c = {s: sum(1 for f in ordered if f.severity == s) for s in SEVERITY_ORDER}
    lines += [f"### Findings ({c['fail']} fail, {c['warn']} warn, {c['info']} info)", ""]
    if ordered:
        lines += _table(["severity", "kind", "phase", "slot", "round", "request", "offset", "detail"],
                        [[f.severity, f"`{f.kind}`", f.phase, f.slot, f.round, f.request, f.offset, f.detail]
                         for f in ordered])
    else:
        lines.append("None.")
    lines.append("")

    if report.isolations:
        lines += ["### Isolation re-runs", ""] + _table(
            ["request", "flagged for", "verdict", "reproduced on hits", "reproduced cold", "detail"],
            [[i.request, f"`{i.kind}`", i.verdict, f"{i.reproduced}/{i.hit_runs}", f"{i.cold_reproduced}/{i.cold_runs}",
              i.detail] for i in report.isolations.values()]) + [""]

    counts = evidence_counts(report)
    lines += ["### Statistical power", "",
              "Upper bounds are one-sided 95% (exact Clopper-Pearson; 3/n for a clean run) on the per-hit "
              "fault rate, counting checked hits as independent trials.", ""]
    lines += [f"- **{name}**: {counts[name]['sentence']}" for name, _, _ in KINDS]
    lines += [f"- sizing: {sizing_sentence(0.01, 0.95, rotation_slots(report))}", ""]
    return "\n".join(lines)


def ttft_rows(report: RunReport) -> list[list[str]]:
    """[phase, path, n, min, p50, p90, p99, max] (ms) per phase and path with samples; '-' when unknown."""
    rows = []
    names = list(dict.fromkeys([*report.phases, *report.latency.phases()]))
    for name in names:
        stats = report.latency.phase(name)
        for arm in ARMS:
            d = stats[arm]
            if d["n"]:
                rows.append([name, arm, str(d["n"])] + [fmt.ms(d[k]) for k in STAT_KEYS[1:]])
        if stats["unknown_cached"]:
            rows.append([name, "unknown cached", str(stats["unknown_cached"])] + ["-"] * 5)
    return rows


def ttft_markdown(report: RunReport) -> list[str]:
    rows = ttft_rows(report)
    if not rows:
        return []
    return ["### TTFT percentiles (ms)", "",
            "Main-arm requests; cold = 0 cached tokens, hit = more; unknown cached tokens count as neither.", ""] \
        + _table(["phase", "path", "n", "min", "p50", "p90", "p99", "max"], rows) + [""]


# --- incident record (header target.incident; tui.core.server.incident) ------------------------------

def incident_rows(report: RunReport) -> list[tuple[str, str]]:
    """(label, value) for every fact the second field report says an operator should log; empty
    when the log has no incident record (older logs, or a soak started without the probe)."""
    target = (report.header.target if report.header else None) or {}
    inc = target.get("incident") or {}
    if not inc:
        return []
    server, model = inc.get("server") or {}, inc.get("model") or {}
    spec, cache, reuse = inc.get("speculative") or {}, inc.get("cache_config") or {}, inc.get("cache_reuse") or {}
    seen = report.server.cache_config if report.server else {}
    block = cache.get("block_size") if cache.get("block_size") not in (None, "unknown") else seen.get("block_size")
    mamba = cache.get("mamba_cache_mode") if cache.get("mamba_cache_mode") not in (None, "unknown") \
        else seen.get("mamba_cache_mode")
    profile = inc.get("profile") or {}
    rows = [
        ("profile", f"{profile.get('name')} ({profile.get('source')}, sha256 {str(profile.get('sha256'))[:12]})"
         if profile else "none"),
        ("server version", str(server.get("version") or "unknown")),
        ("server commit", f"{server.get('commit') or 'unknown'} ({server.get('commit_source') or 'no source'})"),
        ("system_fingerprint", str(server.get("system_fingerprint") or "not reported")),
        ("model", f"{model.get('served') or 'unknown'}" + (f" ({model.get('root')})" if model.get("root") else "")),
        ("quantization", f"{model.get('quantization') or 'unknown'}"
         + (f" (from {model.get('quantization_source')})" if model.get("quantization_source") not in (None, "none")
            else "")),
        ("speculative method", str(spec.get("method") or "unknown")),
        ("drafter", str(spec.get("drafter") or "unknown")),
        ("speculative tokens", str(spec.get("num_speculative_tokens", "unknown"))),
        ("block size", str(block or "unknown")),
        ("mamba cache mode", str(mamba or ("n/a" if seen or cache.get("labels") else "unknown"))),
        ("cache reuse forced off", ("yes" if reuse.get("forced_off") else "no")
         + (f" ({reuse.get('decided_by')})" if reuse.get("decided_by") else "")),
        ("launch command", inc.get("launch_command") or "attached (not launched by hitproof)"),
        ("environment", fmt.kv(inc.get("env")) or "none recorded"),
        ("overlays", "; ".join(f"{o.get('path')} sha256 {o.get('sha256')}" for o in inc.get("overlays") or [])
         or "none"),
        ("sampling", fmt.kv(inc.get("sampling")) or "default"),
        ("seed", f"{inc.get('seed')} (scenario text seed {inc.get('scenario_seed')})"),
        ("hitproof", str(inc.get("hitproof_version") or "unknown")),
    ]
    if (inc.get("probe") or {}).get("probe_error"):
        rows.append(("probe", str(inc["probe"]["probe_error"])))
    return rows


def incident_markdown(report: RunReport) -> list[str]:
    rows = incident_rows(report)
    if not rows:
        return []
    return ["### Incident record", ""] + _table(["", ""], [[k, v] for k, v in rows]) + [""]


def incident_text(report: RunReport) -> str:
    rows = incident_rows(report)
    if not rows:
        return ""
    width = max(len(k) for k, _ in rows)
    return "incident record:\n" + "".join(f"  {k:<{width}}  {v}\n" for k, v in rows)


# --- JUnit ---------------------------------------------------------------------------------

_XML_BAD = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _x(value: Any) -> str:
    return _XML_BAD.sub("\ufffd", fmt.cell(value))


def _finding_text(f: Finding, report: RunReport) -> str:
    text = f"{f.severity.upper()} {f.kind} at {_where(f)}: {f.detail}"
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
    if (report.phases.get(phase) or {}).get("determinism"):
        ran.add("cache_path_divergence")
    return ran


def to_junit(report: RunReport) -> str:
    """One <testsuite name="hitproof">: the run verdict, one case per phase, one per check per phase."""
    suite = ET.Element("testsuite", name="hitproof")
    props = ET.SubElement(suite, "properties")
    server = report.server
    for key, value in (("verdict", report.verdict), ("exit_code", report.exit_code), ("message", _message(report)),
                       ("run_id", report.header.run_id if report.header else None),
                       ("scenario", report.header.scenario.get("name") if report.header else None),
                       ("server.url", server.url if server else None), ("server.version", server.version if server else None),
                       ("server.model", server.model if server else None),
                       ("launch_command", report.header.target.get("launch_command") if report.header else None),
                       ("warning", report.warning), ("power", power_line(report))):
        if value is not None:
            ET.SubElement(props, "property", name=key, value=_x(value))

    # The run itself: an error, interruption or a log that stops early is never green.
    verdict, case = report.verdict, _case(suite, "run", "verdict")
    summary = f"{verdict} (exit {report.exit_code}): {_message(report)}"
    if verdict in UNFINISHED:
        _outcome(case, "error", summary, report.warning or "", type_=verdict)
    elif verdict == "fail":
        _outcome(case, "failure", summary, type_="fail")
    elif verdict == "inconclusive":
        _outcome(case, "skipped", summary)

    fails_by_phase: dict[str, list[Finding]] = {}
    for f in _sorted_findings(report):
        fails_by_phase.setdefault(f.phase, []).append(f)
    for name, phase in report.phases.items():
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
        found = fails_by_phase.get(name, [])
        kinds = _checks_run(report, name) | {f.kind for f in found if f.severity == "fail"} \
            | {f.kind for f in found if f.kind in CHECK_KINDS}
        kinds.discard("server_error")
        for kind in [k for k in CHECK_KINDS if k in kinds] + sorted(kinds - set(CHECK_KINDS)):
            case = _case(suite, f"check.{name}", kind)
            for f in found:
                if f.kind == kind and f.severity == "fail":
                    offset = "" if f.offset is None else f" at offset {f.offset}"
                    _outcome(case, "failure", f"{kind}{offset}: {f.detail}", _finding_text(f, report), type_=kind)
            related = (kind, "kernel_nondeterminism") if kind == "cache_path_divergence" else (kind,)
            notes = [_finding_text(f, report) for f in found if f.kind in related and f.severity != "fail"]
            det = (phase.get("determinism") or {}).get("kind")
            if kind == "cache_path_divergence" and det == "kernel_nondeterminism":
                # hit != hit or cold != cold: the kernel varies on its own, so hit vs cold proves nothing.
                _outcome(case, "skipped", "kernel nondeterminism: outputs vary without the cache, so hit vs cold "
                                          "cannot show a cache-path divergence")
            if notes:
                ET.SubElement(case, "system-out").text = _x(f"{len(notes)} warning/info finding(s), not failures:\n"
                                                            + "\n".join(notes))

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
