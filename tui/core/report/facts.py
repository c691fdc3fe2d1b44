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


def restore_lines(report: RunReport) -> list[str]:
    """What the restore phase saw: each move of the saved slot (cached tokens of the continuation after
    the restore) and each damaged file's outcome."""
    r = (report.phases.get("restore") or {}).get("restore")
    if not r:
        return []
    lines = []
    for m in r.get("moves", []):
        cached = fmt.MISSING if m.get("cached") is None else m["cached"]
        lines.append(f"restore {m.get('how')}: r{m.get('replica')}: {fmt_count(m.get('restored'))} of "
                     f"{fmt_count(m.get('saved'))} saved tokens restored, {cached} reused")
    for d in r.get("damages", []):
        lines.append(f"damaged slot file ({d.get('damage')}, {fmt_count(d.get('bytes'))} bytes) on "
                     f"r{d.get('replica')}: {d.get('outcome') or 'not judged'}")
    return lines


_BUCKET_NAMES = {"first": "first sight", "short_partial": "short partial prefix", "long_partial": "long partial prefix",
                 "full": "full prefix"}


_LEVEL_NAMES = {"alone": "alone", "2": "2 at once", "3": "3 at once", "4+": "4 or more"}


def mix_lines(report: RunReport) -> list[str]:
    """What the mix phase's search covered: hits (of requests) and deviations by cached-length bucket,
    by concurrency at the time, and the seed that replays it."""
    phase = report.phases.get("mix") or {}
    cover = phase.get("coverage")
    if not cover:
        return []

    def cells(table: dict, names: dict | None = None) -> str:
        return ", ".join(f"{(names or {}).get(key, key)} {row['hits']}/{row['requests']}"
                         + (f" ({row['deviations']} deviating)" if row.get("deviations") else "")
                         for key, row in table.items() if row.get("requests"))

    seed = phase.get("seed")
    lines = [f"mix covered (hits/requests), by prefix: {cells(cover.get('buckets') or {}, _BUCKET_NAMES)}",
             f"mix by requests in flight: {cells(cover.get('by_concurrency') or {}, _LEVEL_NAMES)}; near ties {cover.get('near_ties', 0)}"
             + (f"; replay with --seed {seed}" if seed is not None else "")]
    return lines


def fmt_count(value) -> str:
    return fmt.MISSING if value is None else f"{value:,}"

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
    cal = phase.get("fingerprint_tolerance")
    if cal:
        noise = "not measured" if cal.get("noise") is None else f"{cal['noise']:.2g} nats"
        if cal.get("unlike"):
            noise += f", {cal['unlike']} unlike their own state: not calibrated"
        notes.append(f"partition: fingerprint tolerance {cal['used']:.2g} nats (this server's own noise {noise} on "
                     f"{cal['answers']} same-identity answers, x{cal['factor']:g}, at least {cal['floor']:g}, "
                     f"at most the scenario's {cal['scenario']:g})")
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
