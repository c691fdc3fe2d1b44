"""`hitproof report LOG --format html`: one self-contained page with inline SVG charts. Pure.

The page needs no network and no script: inline CSS, inline SVG, every text from the log
escaped. It holds the incident record, the phase table, TTFT cold vs hit per phase (dots over a
box of the percentiles), cached tokens per conversation and agent turn, the hit rate and KV
usage over time with each finding marked on the timeline (a link to its entry), and the
findings with their answers, the offending offset in <mark>.

What a RunReport does not keep (metrics samples, turns, answer texts) HtmlFold folds in one
pass next to it: answer texts only in a sliding window of recent requests, pinned when a
finding names one, so a 500 MB log costs a few extra lines decoded, not its texts in memory. A
finding whose request fell out of the window is looked up in a second pass over request ends.
"""

from __future__ import annotations

import html
import json
from typing import Any, Sequence

from ..config.phase_registry import hook
from ..log.events import Finding
from . import fmt
from .latency import ARMS
from .report import RunReport

from .charts import _e, timeline_chart, timeline_points, ttft_chart, turns_chart  # noqa: F401  (re-exported)
from .html_fold import (COLORS, MAX_ANSWER, MAX_DOTS, MAX_FINDINGS_DETAILED, MAX_FINDINGS_LISTED,  # noqa: F401
                        MAX_TIMELINE, MAX_TURNS, READ_TYPES, TEXT_WINDOW, HtmlFold, read_log)


# --- answers with their marks -----------------------------------------------------------------

def marks_for(finding: Finding, text: str, checks: dict, own_code: str | None = None) -> list[tuple[int, int, str]]:
    """(start, end, class) spans in the answer: the offending span of this finding ("bad"), and the
    request's own code where it appears ("own"). Non-overlapping, sorted."""
    spans: list[tuple[int, int, str]] = []
    offset, kind, ev = finding.offset, finding.kind, finding.evidence or {}
    if offset is not None and 0 <= offset <= len(text):
        length = 0
        if kind == "foreign_code":
            length = len(str(ev.get("matched") or ev.get("code") or ""))
        elif kind == "repetition" and checks.get("repetition"):
            rep = checks["repetition"]
            length = len(str(rep.get("unit") or "")) * int(rep.get("count") or 1)
        elif kind == "recall_miss" and (checks.get("recall") or {}).get("matched"):
            length = len(checks["recall"]["matched"])
        elif kind == "wrong_task" and own_code and text.startswith(own_code, offset):
            length = len(own_code)
        if not length:                                   # a divergence, or no span known: the word at the offset
            stop = offset
            while stop < len(text) and not text[stop].isspace():
                stop += 1
            length = max(stop - offset, 1)
        spans.append((offset, min(offset + length, len(text)), "bad"))
    for foreign in checks.get("foreign") or []:           # every foreign code in the answer, whatever the kind
        at, matched = foreign.get("offset"), str(foreign.get("matched") or "")
        if isinstance(at, int) and matched and 0 <= at < len(text):
            spans.append((at, min(at + len(matched), len(text)), "bad"))
    if own_code:
        at = text.find(own_code)
        if at >= 0:
            spans.append((at, at + len(own_code), "own"))
    spans.sort(key=lambda s: (s[0], s[2] != "bad", -s[1]))
    out: list[tuple[int, int, str]] = []
    for span in spans:
        if span[0] < span[1] and (not out or span[0] >= out[-1][1]):
            out.append(span)
    return out


def marked_html(text: str, spans: Sequence[tuple[int, int, str]], limit: int = MAX_ANSWER) -> str:
    """The answer escaped, each span in <mark class=...>; long answers cut around the first span."""
    start = 0
    if len(text) > limit:
        first = spans[0][0] if spans else 0
        start = max(0, min(first - limit // 4, len(text) - limit))
    stop = min(len(text), start + limit)
    out, at = [], start
    if start:
        out.append('<span class="cut">[... %d characters before]</span>' % start)
    for s, e, cls in spans:
        if e <= start or s >= stop:
            continue
        s, e = max(s, start), min(e, stop)
        out.append(html.escape(text[at:s]))
        label = "the offending span" if cls == "bad" else "the request's own code"
        out.append(f'<mark class="{cls}" data-offset="{s}" title="{label} at character {s}">{html.escape(text[s:e])}</mark>')
        at = e
    out.append(html.escape(text[at:stop]))
    if stop < len(text):
        out.append('<span class="cut">[... %d characters after]</span>' % (len(text) - stop))
    return "".join(out)


# --- the page --------------------------------------------------------------------------------

CSS = """
body{font-family:"DejaVu Sans","Liberation Sans",Arial,sans-serif;margin:0;padding:16px 24px;color:#1b1f24;
background:#fff;font-size:14px;max-width:960px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:22px 0 8px;border-bottom:1px solid #d0d7de;padding-bottom:3px}
h3{font-size:15px;margin:14px 0 6px}
.verdict{display:inline-block;padding:2px 10px;border-radius:4px;font-weight:bold;color:#fff;background:#868e96}
.verdict.pass{background:#2b8a3e}.verdict.fail,.verdict.error{background:#d00000}
.verdict.inconclusive,.verdict.interrupted,.verdict.incomplete{background:#d9a100;color:#000}
table{border-collapse:collapse;margin:6px 0}td,th{border:1px solid #d0d7de;padding:3px 7px;text-align:left;
vertical-align:top}th{background:#f6f8fa}td.n{text-align:right;font-variant-numeric:tabular-nums}
table.facts td:first-child{white-space:nowrap;color:#57606a}table.facts td{word-break:break-all}
.status-pass{color:#2b8a3e;font-weight:bold}.status-fail{color:#d00000;font-weight:bold}
.status-inconclusive{color:#9a6700;font-weight:bold}
svg.chart{display:block;margin:6px 0 2px;background:#fff}
svg .grid{stroke:#e6e8eb;stroke-width:1}svg text{font-family:inherit;fill:#1b1f24}
svg .tick{font-size:11px;fill:#57606a}svg .axis-title{font-size:12px;fill:#57606a}svg .label{font-size:12px;font-weight:bold}
svg .arm{font-size:11px}
.finding{border-left:5px solid #868e96;padding:4px 10px;margin:10px 0;background:#f6f8fa}
.finding.fail{border-color:#d00000}.finding.warn{border-color:#d9a100}
.sev{font-weight:bold;text-transform:uppercase}.sev.fail{color:#d00000}.sev.warn{color:#9a6700}.sev.info{color:#57606a}
pre.answer{white-space:pre-wrap;word-break:break-word;background:#fff;border:1px solid #d0d7de;padding:6px;
margin:4px 0;font-family:"DejaVu Sans Mono",monospace;font-size:12.5px}
mark.bad{background:#ffc9c9;outline:2px solid #d00000}mark.own{background:#d3f9d8}
.cut{color:#868e96}.none{color:#57606a;font-style:italic}.small{color:#57606a;font-size:12px}
"""


def to_html(report: RunReport, fold: HtmlFold | None = None) -> str:
    """The whole page as one string."""
    from .facts import where as place
    from .incident import incident_rows
    from .markdown import ttft_rows
    from .power import KINDS, evidence_counts

    fold = fold or HtmlFold()
    verdict = report.verdict
    header, server = report.header, report.server
    message = report.end.message if report.end else (report.warning or "the log ends before the run did")
    title = f"hitproof: {verdict.upper()} (exit {report.exit_code})"
    out = [f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
           f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{CSS}</style></head><body>']
    scenario = header.scenario.get("name") if header else None
    out.append(f'<h1>hitproof report <span class="verdict {_e(verdict)}">{_e(verdict.upper())} '
               f'(exit {report.exit_code})</span></h1>')
    out.append(f'<p>{_e(message)}; {len(report.starts)} requests, {report.cache_hits()} cache hits, '
               f'{report.last_t:.1f} s; scenario {_e(scenario)}'
               + (f'; {_e(server.dialect)} {_e(server.version or "version unknown")}, model {_e(server.model)} '
                  f'at {_e(server.url)}' if server else "")
               + (f'; run {_e(header.run_id)}' if header and header.run_id else "")
               + (f', started {_e(header.started_at)}' if header and header.started_at else "") + '.</p>')
    if report.warning:
        out.append(f'<p class="status-inconclusive">Warning: {_e(report.warning)}</p>')

    # incident record
    rows = incident_rows(report)
    if not rows and server is not None:
        rows = [("URL", server.url), ("dialect", server.dialect), ("server version", server.version or "unknown"),
                ("model", server.model), ("grid", f"{server.grid} tokens ({server.grid_source})"),
                ("launch command", (header.target.get("launch_command") if header else None)
                 or "attached (not launched by hitproof)")]
    out.append('<h2 id="incident">Incident record</h2>')
    if rows:
        out.append('<table class="facts">' + "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in rows)
                   + "</table>")
    else:
        out.append('<p class="none">The log has no incident record.</p>')

    # phases
    out.append('<h2 id="phases">Phases</h2><table class="phases"><tr><th>phase</th><th>status</th><th>requests</th>'
               '<th>hits</th><th>cached tokens</th><th>TTFT cold p50</th><th>TTFT hit p50</th>'
               '<th>findings f/w/i</th><th>reasons</th></tr>')
    for name, phase in report.phases.items():
        counts = {"fail": 0, "warn": 0, "info": 0}
        for f in report.findings:
            if f.phase == name and f.severity in counts:
                counts[f.severity] += 1
        lat = report.latency.phase(name)
        status = phase.get("status", "running")
        out.append(f'<tr><td>{_e(name)}</td><td class="status-{_e(status)}">{_e(status)}</td>'
                   f'<td class="n">{_e(phase.get("requests"))}</td><td class="n">{_e(phase.get("hits"))}</td>'
                   f'<td class="n">{_e(_thousands(phase.get("cached_tokens")))}</td>'
                   f'<td class="n">{_e(_ms_cell(lat["cold"]["p50"]))}</td><td class="n">{_e(_ms_cell(lat["hit"]["p50"]))}</td>'
                   f'<td class="n">{counts["fail"]}/{counts["warn"]}/{counts["info"]}</td>'
                   f'<td>{_e("; ".join(phase.get("reasons") or []) or "")}</td></tr>')
    out.append("</table>")
    out.extend(_replica_rows(report))
    out += _phase_sections(report)

    # TTFT
    out.append('<h2 id="ttft">Time to first token, cold vs hit</h2>')
    series = {name: {arm: report.latency.values(name, arm) for arm in ARMS} for name in report.latency.phases()}
    out.append(ttft_chart(series))
    percentile_rows = ttft_rows(report)
    if percentile_rows:
        out.append('<table class="percentiles"><tr>' + "".join(f"<th>{h}</th>" for h in
                   ("phase", "path", "n", "min ms", "p50 ms", "p90 ms", "p99 ms", "max ms")) + "</tr>")
        for row in percentile_rows:
            out.append("<tr>" + "".join(f'<td{"" if i < 2 else " class=n"}>{_e(c)}</td>' for i, c in enumerate(row))
                       + "</tr>")
        out.append("</table>")
    out.append('<p class="small">Main-arm requests only; cold = 0 cached tokens, hit = more; a request whose '
               'cached tokens are unknown is neither.</p>')

    # turns
    out.append('<h2 id="turns">Cached tokens per turn</h2>')
    multi = [phase for phase, arm in fold.turns if arm == "main"]
    if not multi:
        out.append('<p class="none">No conversation or agent turns in this run.</p>')
    for phase in dict.fromkeys(multi):
        label = hook(phase, "TURNS_LABEL") or f"{phase} turns"        # the phase names its turns
        out.append(turns_chart(label, fold.turns.get((phase, "main"), []),
                               fold.turns.get((phase, "control"), []) if hook(phase, "TURNS_CONTROL") else ()))

    out.append(_turn_tables(report))

    # timeline
    ordered = sorted(range(len(report.findings)),
                     key=lambda i: ({"fail": 0, "warn": 1, "info": 2}.get(report.findings[i].severity, 3),
                                    report.findings[i].seq))
    out.append('<h2 id="timeline">Hit rate and KV usage over time</h2>')
    detailed, listed = ordered[:MAX_FINDINGS_DETAILED], ordered[MAX_FINDINGS_DETAILED:MAX_FINDINGS_LISTED]
    marked = sorted(detailed + listed)                     # on the timeline: every finding the page shows
    out.append(timeline_chart(fold, [report.findings[i] for i in marked], report.last_t,
                              anchors={k: f"finding-{i}" for k, i in enumerate(marked)}))

    # findings
    c = {s: sum(1 for f in report.findings if f.severity == s) for s in ("fail", "warn", "info")}
    out.append(f'<h2 id="findings">Findings ({c["fail"]} fail, {c["warn"]} warn, {c["info"]} info)</h2>')
    if not ordered:
        out.append('<p class="none">No findings.</p>')
    for index in detailed:
        f = report.findings[index]
        out.append(f'<div class="finding {_e(f.severity)}" id="finding-{index}"><p><span class="sev {_e(f.severity)}">'
                   f'{_e(f.severity)}</span> <b>{_e(f.kind)}</b> at {_e(place(f))}, {f.t:.1f} s: {_e(f.detail)}</p>')
        answer = fold.answers.get(f.request) if f.request is not None else None
        start = report.starts.get(f.request) if f.request is not None else None
        if answer is not None:
            text, checks = answer
            if text:
                spans = marks_for(f, text, checks or {}, start.code if start else None)
                where = "" if f.offset is None else f", offending span at character {f.offset}"
                out.append(f'<p class="small">answer of request {f.request}{where}:</p>'
                           f'<pre class="answer">{marked_html(text, spans)}</pre>')
            else:
                out.append(f'<p class="small">request {f.request} answered nothing (an empty answer).</p>')
        elif f.request is not None:
            out.append(f'<p class="none">The answer of request {f.request} is not in the log.</p>')
        control = (f.evidence or {}).get("control_text")
        if control:
            out.append(f'<p class="small">the cold control (request {_e(f.evidence.get("control_request"))}) '
                       f'answered:</p><pre class="answer">{html.escape(str(control))}</pre>')
        iso = report.isolations.get(f.request) if f.request is not None else None
        if iso is not None and f.severity in ("fail", "warn"):
            out.append(f'<p>isolation of request {f.request} (re-run for {_e(iso.kind)}): <b>{_e(iso.verdict)}</b>, '
                       f'reproduced on {iso.reproduced}/{iso.hit_runs} hits and {iso.cold_reproduced}/{iso.cold_runs} '
                       f'cold; {_e(iso.detail)}</p>')
        if f.evidence:
            out.append(f'<details><summary class="small">evidence</summary><pre class="answer">'
                       f'{_e(json.dumps(f.evidence, ensure_ascii=False, indent=1, default=str))}</pre></details>')
        out.append("</div>")

    if listed:
        out.append(f'<p class="small">{len(listed)} more findings, without their answers:</p><table class="more">'
                   '<tr><th>severity</th><th>kind</th><th>where</th><th>t</th><th>detail</th></tr>')
        for index in listed:
            f = report.findings[index]
            out.append(f'<tr id="finding-{index}"><td class="sev {_e(f.severity)}">{_e(f.severity)}</td>'
                       f'<td>{_e(f.kind)}</td><td>{_e(place(f))}</td><td class="n">{f.t:.1f} s</td>'
                       f'<td>{_e(f.detail[:300])}</td></tr>')
        out.append("</table>")
    if len(ordered) > MAX_FINDINGS_LISTED:
        out.append(f'<p class="none">{len(ordered) - MAX_FINDINGS_LISTED} more findings are in the log and in '
                   f'`hitproof report --format json`; not on this page.</p>')

    # power
    counts = evidence_counts(report)
    out.append('<h2 id="power">Statistical power</h2><ul>'
               + "".join(f"<li><b>{_e(name)}</b>: {_e(counts[name]['sentence'])}</li>" for name, _, _ in KINDS)
               + "</ul>")
    tool = header.tool.get("version") if header else None
    out.append(f'<p class="small">hitproof{" " + _e(tool) if tool else ""}: a self-contained page, no script, '
               "no network.</p></body></html>\n")
    return "".join(out)


def _replica_rows(report: RunReport) -> list[str]:
    """Behind a router: a row per replica, how requests were attributed, and the routing judgment."""
    fold = report.replicas
    if not fold.active:
        return []
    from .replicas import rate_cell

    out = ['<h2 id="replicas">Replicas</h2><table class="phases"><tr><th>replica</th><th>url</th><th>requests</th>'
           '<th>hits</th><th>hit rate</th><th>cached tokens</th><th>findings f/w/i</th></tr>']
    for r in fold.rows():
        f = r["findings"]
        out.append(f'<tr><td>{_e(r["label"])}</td><td>{_e(r["url"])}</td><td class="n">{r["requests"]}</td>'
                   f'<td class="n">{r["hits"]}</td><td class="n">{_e(rate_cell(r["hit_rate"]))}</td>'
                   f'<td class="n">{_e(_thousands(r["cached_tokens"]))}</td>'
                   f'<td class="n">{f["fail"]}/{f["warn"]}/{f["info"]}</td></tr>')
    out.append("</table>")
    how = fold.judged.attribution if fold.judged and fold.judged.attribution else fold.attribution
    ok, detail = fold.routing()
    out.append(f"<p>Attributed by {_e(how or 'nothing')}."
               + (f' <span class="status-inconclusive">Routing: {_e(detail)}</span>' if not ok else "") + "</p>")
    return out


def _turn_tables(report: RunReport) -> str:
    """A phase's turns, a row each (the agent replay: tokens, TTFT, problems, and the acceptance length
    with reuse and in the control arm, a collapsed one in red)."""
    from . import phase_facts

    out = []
    for table in phase_facts.turn_tables(report):
        out.append(f'<h3 id="{_e(table.anchor)}">{_e(table.title)}</h3><table class="{_e(table.anchor)}"><tr>'
                   + "".join(f"<th>{_e(h)}</th>" for h in table.headers) + "</tr>")
        for row, key, flagged in zip(table.rows, table.keys, table.flagged):
            cells = []
            for i, cell in enumerate(row):
                classes = ([] if i in table.text_columns else ["n"]) + (["status-fail"] if i in flagged else [])
                attrs = f' class="{" ".join(classes)}"' if classes else ""
                if i in table.data_columns:
                    attrs += f' data-{table.data_columns[i]}="{_e(cell)}"'
                cells.append(f"<td{attrs}>{_e(cell)}</td>")
            out.append(f'<tr data-turn="{_e(key)}">' + "".join(cells) + "</tr>")
        out.append(f'</table><p class="small">{_e(table.sentence)}.</p>')
    return "".join(out)


def _phase_sections(report: RunReport) -> list[str]:
    """Each phase's own section (partition's identity pairs, eviction's passes), in the order they ran."""
    from . import phase_facts

    def table(header, rows) -> str:
        return ("<table><tr>" + "".join(f"<th>{_e(h)}</th>" for h in header) + "</tr>"
                + "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in r) + "</tr>" for r in rows) + "</table>")
    out = []
    for section in phase_facts.sections(report):
        paragraphs = section.paragraphs if section.html_paragraphs is None else section.html_paragraphs
        out.append(f'<h3 id="{_e(section.anchor)}">{_e(section.title)}</h3>'
                   + "".join(f'<p class="small">{_e(x)}</p>' for x in paragraphs)
                   + (table(section.header, section.rows) if section.rows else "")
                   + "".join(f'<p class="small">{_e(n)}</p>' for n in section.notes))
    return out


def _thousands(value: Any) -> Any:
    return f"{value:,}" if isinstance(value, int) else value


def _ms_cell(value: float | None) -> str:
    return "-" if value is None else f"{fmt.ms(value)} ms"
