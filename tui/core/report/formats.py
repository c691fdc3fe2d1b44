"""The report formats people and CI read, in one place to import them from: markdown for a bug
report (report/markdown.py), JUnit XML for CI (report/junit.py), the incident record as text
(report/incident.py), JSON (RunReport.to_json() with power.power_json() as its "power" object and the
launch's incident record). HTML is report/html.py; the plain-text summary is the headless console's
(tui/headless.py).
"""

from __future__ import annotations

import json

from .incident import incident_rows, incident_text
from .junit import CHECK_KINDS, to_junit
from .markdown import incident_markdown, to_markdown, ttft_markdown, ttft_rows
from .power import power_json
from .report import RunReport


def to_json(report: RunReport) -> str:
    """`hitproof report --format json`: the report's JSON keys, "power" and "incident" (null when none)."""
    data = report.to_json()
    data["power"] = power_json(report)
    data["incident"] = ((report.header.target if report.header else None) or {}).get("incident") or None
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"

__all__ = ["CHECK_KINDS", "incident_markdown", "incident_rows", "incident_text", "to_json", "to_junit",
           "to_markdown", "ttft_markdown", "ttft_rows"]
