"""A fast reading of the Prometheus text format for what parse_metrics keeps: each sample's value summed
per sample name, and the labels of `*_info` samples. The same families and sample names as
prometheus_client's text parser (its family tracking: HELP and TYPE open a family, a sample outside its
allowed names is a family of its own, a counter's bare family name gets `_total`), read with str methods
instead of its character-by-character scanner: vLLM's /metrics (hundreds of histogram buckets) took 37 ms a
scrape under cProfile on an H100 host, a tenth of hitproof's CPU (2026-12-05).

Anything this reading does not take as it is (a quoted or invalid metric name, a `__name__` label, an
exemplar, an `info` family, a value it cannot read) answers None: the caller parses the whole text with
prometheus_client instead. tests/checks/test_metrics_text.py holds both readings equal."""

from __future__ import annotations

import functools
import re

from prometheus_client.parser import text_string_to_metric_families

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_ALLOWED = {"counter": ("",), "gauge": ("",), "summary": ("_count", "_sum", ""),
            "histogram": ("_count", "_sum", "_bucket")}


def read_values(text: str) -> tuple[dict[str, float], dict[str, dict[str, str]]] | None:
    values: dict[str, float] = {}
    info: dict[str, dict[str, str]] = {}
    family, typ, allowed = "", "untyped", ()
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if line[0] == "#":
            parts = line.split(None, 3)
            if len(parts) < 2 or parts[1] not in ("HELP", "TYPE"):
                continue
            if len(parts) < 3:
                return None
            name = parts[2]
            if not _NAME.match(name):
                return None                      # quoted or invalid: prometheus_client's to judge
            if parts[1] == "TYPE":
                if len(parts) < 4 or parts[3].strip() == "info":
                    return None
                if name != family:
                    family = name
                typ = parts[3].strip()
                allowed = tuple(name + suffix for suffix in _ALLOWED.get(typ, ("",)))
            elif name != family:                 # HELP of a new family
                family, typ, allowed = name, "untyped", (name,)
            continue
        brace = line.find("{")
        if brace >= 0:
            name = line[:brace].strip()
            head, close, rest = line.rpartition("}")
            if not close or "__name__" in head:
                return None
        else:
            name, _, rest = line.partition(" ")
            if "\t" in name:
                return None
        fields = rest.split()
        if not fields or len(fields) > 2 or " # " in line or "_" in rest or not _NAME.match(name):
            return None
        try:
            number = _number(fields[0])
            if len(fields) == 2:
                _number(fields[1])               # a timestamp: read (and dropped) as prometheus_client does
        except ValueError:
            return None
        if name in allowed:
            if typ == "counter" and name == family and not family.endswith("_total"):
                name += "_total"
        else:                                    # a family of its own (prometheus_client: untyped)
            family, typ, allowed = "", "untyped", ()
        if name.endswith("_created"):
            continue
        if name.endswith("_info"):
            labels = _labels(line)
            if labels is None:
                return None
            labels.pop("engine", None)
            info[name] = labels
            continue
        values[name] = values.get(name, 0.0) + number
    return values, info


def _number(text: str) -> float:
    return float(int(text)) if text.lstrip("+-").isdigit() else float(text)


def _labels(line: str) -> dict[str, str] | None:
    """One sample's labels, read by prometheus_client (an `_info` sample: a handful a scrape), a new dict each
    call (the caller edits it)."""
    labels = _read_labels(line)
    return None if labels is None else dict(labels)


@functools.lru_cache(maxsize=64)
def _read_labels(line: str) -> tuple[tuple[str, str], ...] | None:
    """Kept per line: an info line is the same every scrape, and vLLM's cache_config_info has about 60 labels,
    which prometheus_client reads character by character (about 2% of hitproof's CPU on an H100, 2026-12-05)."""
    try:
        for family in text_string_to_metric_families(line + "\n"):
            for sample in family.samples:
                return tuple(sample.labels.items())
    except (ValueError, TypeError):
        return None
    return ()
