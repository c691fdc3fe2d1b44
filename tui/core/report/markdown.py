"""`hitproof report --format markdown`: a bug-report paste. Verdict, server and run facts, the incident
record, phases, timing and determinism, TTFT percentiles, findings, isolation re-runs and power. Pure."""

from __future__ import annotations

from typing import Any

from .replicas import rate_cell
from . import facts, fmt, phase_facts
from .facts import SEVERITY_ORDER
from .incident import incident_rows
from .latency import ARMS, STAT_KEYS
from .power import KINDS, evidence_counts, rotation_slots, sizing_sentence
from .report import RunReport


def _md(value: Any) -> str:
    return fmt.cell(value).replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def _row(*cells: Any) -> str:
    return "| " + " | ".join(_md(c) for c in cells) + " |"


def _table(headers: list[str], rows: list[list[Any]]) -> list[str]:
    return [_row(*headers), "|" + "|".join("---" for _ in headers) + "|"] + [_row(*r) for r in rows]


def to_markdown(report: RunReport) -> str:
    """A bug-report paste: verdict, server and run facts, phases, timing, findings, isolation, power."""
    lines = [f"## hitproof: {report.verdict.upper()} (exit {report.exit_code})", "",
             f"{facts.message(report)}; {len(report.starts)} requests, {report.cache_hits()} cache hits, "
             f"{report.last_t:.1f} s.", ""]
    if report.warning:
        lines += [f"> **Warning:** {report.warning}", ""]
    for section in (_server_and_run, incident_markdown, _phases, _replicas, _phase_sections, _timing,
                    ttft_markdown, _turn_tables, _findings, _isolations, _power):
        lines += section(report)
    return "\n".join(lines)


def _server_and_run(report: RunReport) -> list[str]:
    header, server = report.header, report.server
    target = (header.target if header else None) or {}
    rows: list[list[Any]] = []
    if server is not None:
        rows += [["URL", server.url], ["dialect", server.dialect], ["server version", server.version or "unknown"],
                 ["model", server.model], ["grid", f"{server.grid} tokens ({server.grid_source})"],
                 ["tokenizer", server.tokenizer], ["cold requests forced by", server.salts or "unknown"],
                 ["cache config", fmt.kv(server.cache_config) or "unknown"]]
    elif target.get("url"):
        rows.append(["URL", target["url"]])
    rows.append(["launch command", target.get("launch_command") or "attached (not launched by hitproof)"])
    if target.get("env"):
        rows.append(["environment", fmt.kv(target["env"])])
    if header is not None:
        scen, tool = header.scenario or {}, header.tool or {}
        rows += [["scenario", f"{fmt.word(scen.get('name'))} ({fmt.word(scen.get('source'))}, sha256 "
                              f"{str(scen.get('sha256') or 'unknown')[:12]})"],
                 ["seed", facts.settings(report).get("seed")],
                 ["sampling", fmt.kv(facts.sampling(report)) or "default"],
                 ["cache reuse forced off", "yes" if target.get("cache_reuse_forced_off") else "no"],
                 ["run", f"{header.run_id or 'unknown'}, started {header.started_at or 'unknown'}"],
                 ["hitproof", f"{fmt.word(tool.get('version'))} (python {fmt.word(tool.get('python'))})"],
                 ["command", " ".join(str(a) for a in tool.get("argv") or [] if a is not None) or "unknown"]]
    return ["### Server and run", ""] + _table(["", ""], rows) + [""]


def _phases(report: RunReport) -> list[str]:
    rows = []
    for name, phase in report.phases.items():
        c = facts.counts(report, name)
        rows.append([name, phase.get("status", "?"), phase.get("requests"), phase.get("hits"),
                     phase.get("hits_proven") or "per request", phase.get("cached_tokens"),
                     fmt.ms(phase.get("ttft_cold_ms")), fmt.ms(phase.get("ttft_hit_ms")),
                     f"{c['fail']}/{c['warn']}/{c['info']}"])
    lines = ["### Phases", ""] + _table(["phase", "status", "requests", "hits", "hits proven", "cached tokens",
                                         "TTFT cold ms", "TTFT hit ms", "findings f/w/i"], rows) + [""]
    if report.power_target is not None:
        lines += [f"**Power target:** {report.power_target.sentence}.", ""]
    reasons = [f"- {name}: {r}" for name, phase in report.phases.items() for r in phase.get("reasons") or []]
    return lines + (reasons + [""] if reasons else [])


def _phase_sections(report: RunReport) -> list[str]:
    """Each phase's own section (partition's identity pairs, eviction's passes), in the order they ran."""
    lines = []
    for section in phase_facts.sections(report):
        lines += [f"### {section.title}", ""]
        for paragraph in section.paragraphs:
            lines += [paragraph, ""]
        lines += (_table(list(section.header), section.rows) + [""]) if section.rows else []
        lines += [f"- {n}" for n in section.notes] + ([""] if section.notes else [])
    return lines


def _timing(report: RunReport) -> list[str]:
    timing = facts.ttft_lines(report) + phase_facts.timing_lines(report)
    return ["### Timing and determinism", ""] + [f"- {t}" for t in timing] + [""] if timing else []


def _replicas(report: RunReport) -> list[str]:
    fold = report.replicas
    if not fold.active:
        return []
    rows = [[r["label"], r["url"], r["requests"], r["hits"], rate_cell(r["hit_rate"]), r["cached_tokens"],
             f"{r['findings']['fail']}/{r['findings']['warn']}/{r['findings']['info']}"] for r in fold.rows()]
    lines = ["### Replicas", ""] + _table(["replica", "url", "requests", "hits", "hit rate", "cached tokens",
                                            "findings f/w/i"], rows) + [""]
    how = fold.judged.attribution if fold.judged and fold.judged.attribution else fold.attribution
    notes = [f"Attributed by {how}." if how else "",
             f"{fold.unattributed} request(s) not attributed to a replica." if fold.unattributed else "",
             f"{fold.routing_misses} routing miss(es): meant to hit, sent to a replica that had never served the memo, "
             f"sent again." if fold.routing_misses else ""]
    ok, detail = fold.routing()
    if not ok:
        notes.append(f"**Routing:** {detail}.")
    return lines + [" ".join(n for n in notes if n), ""]


def _turn_tables(report: RunReport) -> list[str]:
    lines = []
    for table in phase_facts.turn_tables(report):
        lines += [f"### {table.title}", ""] + _table(table.headers, table.rows) + ["", table.sentence + ".", ""]
    return lines


def _findings(report: RunReport) -> list[str]:
    ordered = facts.sorted_findings(report)
    c = {s: sum(1 for f in ordered if f.severity == s) for s in SEVERITY_ORDER}
    lines = [f"### Findings ({c['fail']} fail, {c['warn']} warn, {c['info']} info)", ""]
    if ordered and report.replicas.active:
        lines += _table(["severity", "kind", "phase", "replica", "slot", "round", "request", "offset", "detail"],
                        [[f.severity, f"`{f.kind}`", f.phase, None if f.replica is None else f"r{f.replica}", f.slot,
                          f.round, f.request, f.offset, f.detail] for f in ordered])
    elif ordered:
        lines += _table(["severity", "kind", "phase", "slot", "round", "request", "offset", "detail"],
                        [[f.severity, f"`{f.kind}`", f.phase, f.slot, f.round, f.request, f.offset, f.detail]
                         for f in ordered])
    else:
        lines.append("None.")
    return lines + [""]


def _isolations(report: RunReport) -> list[str]:
    if not report.isolations:
        return []
    return ["### Isolation re-runs", ""] + _table(
        ["request", "flagged for", "verdict", "reproduced on hits", "reproduced cold", "detail"],
        [[i.request, f"`{i.kind}`", i.verdict, f"{i.reproduced}/{i.hit_runs}", f"{i.cold_reproduced}/{i.cold_runs}",
          i.detail] for i in report.isolations.values()]) + [""]


def _power(report: RunReport) -> list[str]:
    counts = evidence_counts(report)
    lines = ["### Statistical power", "",
             "Upper bounds are one-sided 95% (exact Clopper-Pearson; 3/n for a clean run) on the per-hit "
             "fault rate, counting checked hits as independent trials.", ""]
    lines += [f"- **{name}**: {counts[name]['sentence']}" for name, _, _ in KINDS]
    return lines + [f"- sizing: {sizing_sentence(0.01, 0.95, rotation_slots(report))}", ""]


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
            "Main-arm requests; cold and hit as proven; unknown cached tokens count as neither.", ""] \
        + _table(["phase", "path", "n", "min", "p50", "p90", "p99", "max"], rows) + [""]


def incident_markdown(report: RunReport) -> list[str]:
    rows = incident_rows(report)
    if not rows:
        return []
    return ["### Incident record", ""] + _table(["", ""], [[k, v] for k, v in rows]) + [""]

