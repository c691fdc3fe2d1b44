"""Per replica, behind a router: what each served, its hits and findings, folded from the event stream
(live for the app's strip and the soak's routing judgment, from a log for every report format).

A row: index, label ("r0"), url, requests (main arm), hits (proven, as the run's count), hit_rate,
all_requests (every arm), cached_tokens (proven, of hits), findings {fail, warn, info}.
"""

from __future__ import annotations

from typing import Any

from ..log.events import Event, Finding, ReplicasJudged, RequestFinished, RequestStarted, ServerInfo
from . import fmt
from .power import proven_hit

ZERO = {"fail": 0, "warn": 0, "info": 0}


class ReplicaFold:
    def __init__(self) -> None:
        self.replicas: list[dict[str, Any]] = []      # {index, label, url, models}
        self.attribution = ""                          # ServerInfo.replica_attribution
        self.requests: dict[int, int] = {}
        self.hits: dict[int, int] = {}
        self.sent: dict[int, int] = {}
        self.cached: dict[int, int] = {}
        self.findings: dict[int, dict[str, int]] = {}
        self.unattributed = 0
        self.routing_misses = 0
        self.judged: ReplicasJudged | None = None
        self._arm: dict[int, str] = {}

    @property
    def active(self) -> bool:
        return bool(self.replicas)

    def feed(self, event: Event) -> None:
        if isinstance(event, ServerInfo):
            self.replicas = list(event.replicas)
            self.attribution = event.replica_attribution
        elif not self.replicas:
            return
        elif isinstance(event, RequestStarted):
            self._arm[event.request] = event.arm
        elif isinstance(event, RequestFinished):
            arm = self._arm.pop(event.request, "main")
            replica = event.replica
            if (event.checks or {}).get("routing"):
                self.routing_misses += 1
            if replica is None:
                self.unattributed += 1
                return
            self.sent[replica] = self.sent.get(replica, 0) + 1
            if arm != "main":
                return
            hit = proven_hit(event)
            self.requests[replica] = self.requests.get(replica, 0) + 1
            self.hits[replica] = self.hits.get(replica, 0) + hit
            if hit:
                cached = event.cached_tokens if event.cached_tokens is not None else (event.cached_min or 0)
                self.cached[replica] = self.cached.get(replica, 0) + cached
        elif isinstance(event, Finding) and event.replica is not None:
            counts = self.findings.setdefault(event.replica, dict(ZERO))
            counts[event.severity] = counts.get(event.severity, 0) + 1
        elif isinstance(event, ReplicasJudged):
            self.judged = event

    def rows(self) -> list[dict[str, Any]]:
        out = []
        for r in self.replicas:
            i = r["index"]
            requests, hits = self.requests.get(i, 0), self.hits.get(i, 0)
            out.append({"index": i, "label": r.get("label") or f"r{i}", "url": r.get("url"), "requests": requests,
                        "hits": hits, "hit_rate": round(hits / requests, 4) if requests else None,
                        "all_requests": self.sent.get(i, 0), "cached_tokens": self.cached.get(i, 0),
                        "findings": dict(self.findings.get(i, ZERO))})
        return out

    def routing(self) -> tuple[bool, str]:
        if self.judged is not None:
            return self.judged.routing_ok, self.judged.detail
        return routing_judgment(self.rows())

    def to_json(self) -> dict[str, Any] | None:
        if not self.active:
            return None
        ok, detail = self.routing()
        return {"attribution": self.attribution,
                "attribution_detail": self.judged.attribution if self.judged else None,
                "rows": self.rows(), "unattributed": self.unattributed, "routing_misses": self.routing_misses,
                "routing_ok": ok, "routing_detail": detail or None}


def routing_judgment(rows: list[dict[str, Any]]) -> tuple[bool, str]:
    """(the routing let every replica be checked, why not). A replica that served requests and never
    hit while another did is a routing problem, and so is one that served none at all: its cache was
    never checked, so the run proves nothing about it."""
    hitting = [r for r in rows if r["hits"]]
    idle = [r for r in rows if not r["hits"]]
    if not hitting or not idle:
        return True, ""
    words = []
    for r in idle:
        what = "served no request" if not r["all_requests"] else f"served {r['requests']} request(s) and never hit"
        words.append(f"replica {r['label']} ({r['url']}) {what}")
    others = ", ".join(f"{r['label']} {r['hits']}" for r in hitting)
    return False, (f"{'; '.join(words)}, while hits landed elsewhere ({others} hits): a routing problem (or that "
                   f"replica's cache is off), not a pass: its cache was never checked")


def rate_cell(rate: float | None) -> str:
    return fmt.MISSING if rate is None else f"{rate * 100:.0f}%"


def replica_lines(fold: ReplicaFold) -> list[str]:
    """The per-replica table as plain lines (fits 80 columns), then how requests were attributed."""
    if not fold.active:
        return []
    lines = ["replicas:", f"  {'replica':<8} {'url':<27} {'req':>5} {'hits':>5} {'rate':>5} {'cached':>8} {'f/w/i':>7}"]
    for r in fold.rows():
        f = r["findings"]
        rate = rate_cell(r["hit_rate"])
        url = (r["url"] or "")[:27]
        lines.append(f"  {r['label']:<8} {url:<27} {r['requests']:>5} {r['hits']:>5} {rate:>5} "
                     f"{r['cached_tokens']:>8} {f['fail']}/{f['warn']}/{f['info']:<3}".rstrip())
    if fold.unattributed:
        lines.append(f"  {fold.unattributed} request(s) not attributed to a replica")
    if fold.routing_misses:
        lines.append(f"  {fold.routing_misses} request(s) meant to hit went to a replica that had never served "
                     f"their memo (routing misses, sent again)")
    how = fold.judged.attribution if fold.judged and fold.judged.attribution else fold.attribution
    if how:
        lines.append(f"  attributed by {how}")
    ok, detail = fold.routing()
    if not ok:
        lines.append(f"  routing: {detail}")
    return lines
