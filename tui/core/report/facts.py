"""Facts every report format states the same way: the run's message, where a finding is, findings
in severity order, counts per phase, sampling, the TTFT cut and determinism lines."""

from __future__ import annotations

from typing import Any

from ..log.events import Finding
from . import fmt
from .report import RunReport

SEVERITY_ORDER = {"fail": 0, "warn": 1, "info": 2}
UNFINISHED = ("error", "interrupted", "incomplete")


def message(report: RunReport) -> str:
    return report.end.message if report.end else "the log ends before the run did"


def where(f: Finding) -> str:
    parts = [f.phase or "run"]
    for label, value in (("slot", f.slot), ("round", f.round), ("request", f.request), ("offset", f.offset)):
        if value is not None:
            parts.append(f"{label} {value}")
    return ", ".join(parts)


def sorted_findings(report: RunReport) -> list[Finding]:
    return sorted(report.findings, key=lambda f: (SEVERITY_ORDER.get(f.severity, 3), f.seq))


def counts(report: RunReport, phase: str) -> dict[str, int]:
    counts = {"fail": 0, "warn": 0, "info": 0}
    for f in report.findings:
        if f.phase == phase and f.severity in counts:
            counts[f.severity] += 1
    return counts


def settings(report: RunReport) -> dict[str, Any]:
    return ((report.header.scenario if report.header else None) or {}).get("settings") or {}


def sampling(report: RunReport) -> dict[str, Any]:
    target = report.header.target if report.header else {}
    return (target or {}).get("sampling") or settings(report).get("sampling") or {}


def ttft_lines(report: RunReport) -> list[str]:
    lines = []
    for name, phase in report.phases.items():
        cold, hit, cut = phase.get("ttft_cold_ms"), phase.get("ttft_hit_ms"), phase.get("ttft_cut_pct")
        if cut is None:
            continue
        size = f" ({phase['prompt_tokens']} prompt tokens)" if name == "long_prompt" and phase.get("prompt_tokens") else ""
        lines.append(f"{name}{size}: TTFT {fmt.ms(cold)} ms cold -> {fmt.ms(hit)} ms hit ({cut}% cut)")
    return lines


def determinism_line(report: RunReport) -> str | None:
    d = (report.phases.get("determinism") or {}).get("determinism")
    if not d:
        return None
    off = lambda v: "none" if v is None else f"char {v}"   # noqa: E731
    return (f"determinism: {d.get('kind')} (first divergence: hit vs cold {off(d.get('hit_vs_cold'))}, hit vs hit "
            f"{off(d.get('hit_vs_hit'))}, cold vs cold {off(d.get('cold_vs_cold'))}, short cold control "
            f"{off(d.get('short_control'))})")



PARTITION_HEADER = ("field", "pair", "status", "cross", "reused", "by fp", "repeats hit", "fp")
EVICTION_HEADER = ("pass", "mode", "t (s)", "evicted", "partial", "re-hits", "KV max", "preempt", "f/w/i")


def partition_rows(report: RunReport) -> tuple[list[list[str]], list[str]]:
    """(one row per identity pair the partition phase tried, a sentence per field it could not try)."""
    phase = report.phases.get("partition") or {}
    rows = []
    for pair in phase.get("pairs") or []:
        same = ", ".join(f"{n} {v['hits']}/{v['repeats']}" for n, v in (pair.get("same_identity") or {}).items())
        fp = pair.get("fingerprints")
        rows.append([pair["field"], " / ".join(pair["pair"]), pair["status"], str(pair["cross_requests"]),
                     str(pair["cross_reused"]), str(pair["fingerprint_leaks"]), same or "none",
                     fmt.MISSING if fp in (None, "not compared") else fp])
    notes = [f"partition: {n['field']} not tried: {n['why']}" for n in phase.get("not_tried") or []]
    return rows, notes


def eviction_rows(report: RunReport) -> tuple[list[str], list[list[str]]]:
    """(sentences: the pool against the capacity and the evictions observed, one row per pass)."""
    phase = report.phases.get("eviction") or {}
    if "pool_memos" not in phase:
        return [], []
    capacity = phase.get("capacity_tokens")
    lines = [f"eviction: {phase['pool_memos']} memos, {fmt.cell(phase.get('pool_tokens'))} tokens, against a capacity "
             f"of {'unknown' if capacity is None else capacity} tokens",
             f"  ({phase.get('capacity_source')})",
             f"eviction: {phase.get('evictions', 0)} evictions observed ({phase.get('evictions_partial', 0)} partial), "
             f"at least {phase.get('min_evictions_per_memo', 0)} per memo"]
    rows = []
    for p in phase.get("passes") or []:
        f = p.get("findings") or {}
        kv, pre = p.get("kv_usage_max"), p.get("preemptions")
        rows.append([str(p["pass"]), p["mode"], _span(p["t_start_s"], p["t_end_s"]), str(p["evicted"]),
                     str(p["partial"]), str(p["rehits"]), fmt.pct(kv, 1) if kv is not None else fmt.MISSING,
                     fmt.MISSING if pre is None else str(int(pre)),
                     f"{f.get('fail', 0)}/{f.get('warn', 0)}/{f.get('info', 0)}"])
    return lines, rows


def _span(start: float, end: float) -> str:
    digits = 0 if end >= 100 else 1
    return f"{start:.{digits}f}-{end:.{digits}f}"


def text_table(header: tuple[str, ...], rows: list[list[str]], indent: str = "  ") -> list[str]:
    """Left-aligned columns two spaces apart (plain text reports)."""
    widths = [max(len(r[i]) for r in [list(header), *rows]) for i in range(len(header))]
    return [(indent + "  ".join(f"{c:<{w}}" for c, w in zip(r, widths))).rstrip() for r in [list(header), *rows]]
