"""The report formats people and CI read, in one place to import them from: markdown for a bug
report (report/markdown.py), JUnit XML for CI (report/junit.py), the incident record as text
(report/incident.py). JSON stays RunReport.to_json() with power.power_json() as its "power"
object; HTML is report/html.py; the plain-text summary is the headless console's (tui/headless.py).
"""

from __future__ import annotations

from .incident import incident_rows, incident_text
from .junit import CHECK_KINDS, to_junit
from .markdown import incident_markdown, to_markdown, ttft_markdown, ttft_rows

__all__ = ["CHECK_KINDS", "incident_markdown", "incident_rows", "incident_text", "to_junit", "to_markdown",
           "ttft_markdown", "ttft_rows"]
