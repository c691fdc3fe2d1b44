"""Check an HTML report the way a person would get it: parsed (html.parser, the SVGs with
ElementTree) and rendered by a real headless Chromium (Debian's `chromium` package) to a PNG."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

from support.png import colour_counts

SVG_NS = "{http://www.w3.org/2000/svg}"
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars")


@dataclass
class Page:
    html: str
    tags: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    text: str = ""
    charts: dict[str, list[ET.Element]] = field(default_factory=dict)    # data-chart -> its <svg>s


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, {k: v or "" for k, v in attrs}))
        if tag in ("style", "svg"):
            self._skip += 1

    def handle_endtag(self, tag):
        if tag in ("style", "svg"):
            self._skip -= 1

    def handle_data(self, data):
        if not self._skip:
            self.text.append(data)


def parse_page(text: str) -> Page:
    collector = _Collector()
    collector.feed(text)
    collector.close()
    page = Page(html=text, tags=collector.tags, text="".join(collector.text))
    for match in re.finditer(r"<svg\b.*?</svg>", text, re.S):
        svg = ET.fromstring(match.group())               # each chart is well-formed XML on its own
        page.charts.setdefault(svg.get("data-chart"), []).append(svg)
    return page


def find(svg: ET.Element, tag: str, cls: str | None = None) -> list[ET.Element]:
    """Descendants of a tag (no namespace prefix needed) whose class list holds `cls`."""
    return [e for e in svg.iter(SVG_NS + tag) if cls is None or cls in (e.get("class") or "").split()]


def assert_self_contained(page: Page) -> None:
    """No script, nothing fetched: no src, links only to anchors in the page, no CSS url() or @import."""
    for tag, attrs in page.tags:
        assert tag not in ("script", "iframe", "img", "link", "object", "embed", "base"), tag
        assert not any(name.startswith("on") for name in attrs), (tag, attrs)       # no inline handlers
        assert "src" not in attrs and "srcset" not in attrs, (tag, attrs)
        for name in ("href", "xlink:href", "action", "formaction"):
            if name in attrs:
                assert attrs[name].startswith("#"), (tag, attrs)
    styles = re.findall(r"<style>(.*?)</style>", page.html, re.S)
    assert styles and not any("url(" in s or "@import" in s for s in styles)


def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        raise AssertionError("chromium is not installed: `hitproof setup --test-deps` installs Debian's "
                             "package (README command 2 runs it); the HTML report is tested by rendering it")
    return path


def screenshot(html_file: Path, png: Path, width: int = 1000, height: int = 2600) -> Path:
    """Render a local file in headless Chromium (a fresh profile, no network services) into a PNG."""
    png.parent.mkdir(parents=True, exist_ok=True)
    # rendered beside it, then moved over it at once: the manual's tests check the committed screenshot exists
    # while this one is re-rendered in a parallel worker (an unlink first left it missing for seconds)
    rendering = png.with_name(f".{png.stem}.rendering{png.suffix}")
    rendering.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="hitproof-chromium-") as profile:
        result = subprocess.run([chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                                 f"--screenshot={rendering}", f"--window-size={width},{height}",
                                 html_file.resolve().as_uri()],
                                capture_output=True, text=True, timeout=180)
    assert result.returncode == 0 and rendering.exists(), result.stdout + result.stderr
    os.replace(rendering, png)
    return png


def colours(png: Path):
    return colour_counts(png)


def check_report_page(log: Path, folder: Path) -> Page:
    """`hitproof report LOG --format html` of a recorded soak: a self-contained page whose three
    charts are there, rendered by headless Chromium with each series' colour on screen."""
    from support.cli import hitproof_argv, ROOT
    from tui.core.report.html import COLORS

    out = folder / "report.html"
    result = subprocess.run(hitproof_argv("report", str(log), "--format", "html", "--output", str(out)), cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    page = parse_page(out.read_text(encoding="utf-8"))
    assert_self_contained(page)
    assert {"ttft", "turns", "timeline"} <= set(page.charts), list(page.charts)
    assert find(page.charts["ttft"][0], "circle", "cold") and find(page.charts["ttft"][0], "circle", "hit")
    assert find(page.charts["timeline"][0], "polyline", "rate")
    seen = colours(screenshot(out, folder / "report.png"))
    for name in ("cold", "hit", "cached", "rate"):
        assert seen[COLORS[name]] >= 50, (name, seen[COLORS[name]])
    return page
