"""Facts every report format states the same way: the run's message, where a finding is, findings
in severity order, counts per phase, sampling, the TTFT cut lines, a plain-text table. What a phase
adds of its own comes from its module (phase_facts.py)."""

from __future__ import annotations

from typing import Any

from ..log.events import Finding
from . import fmt, phase_facts
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
        label = phase_facts.ttft_label(name, phase)
        lines.append(f"{name}{label}: TTFT {fmt.ms(cold)} ms cold -> {fmt.ms(hit)} ms hit ({cut}% cut)")
    return lines


def fmt_count(value) -> str:
    return fmt.MISSING if value is None else f"{value:,}"


def text_table(header: tuple[str, ...], rows: list[list[str]], indent: str = "  ") -> list[str]:
    """Left-aligned columns two spaces apart (plain text reports)."""
    widths = [max(len(r[i]) for r in [list(header), *rows]) for i in range(len(header))]
    return [(indent + "  ".join(f"{c:<{w}}" for c, w in zip(r, widths))).rstrip() for r in [list(header), *rows]]
