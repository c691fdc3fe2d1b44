"""The one set of formatters for what people read: numbers, durations, rates, missing values.
Never a raw Python None: a missing value is "-" in a table cell and "none" in a sentence."""

from __future__ import annotations

from typing import Any

MISSING = "-"            # a table cell with nothing known
NONE = "none"            # a sentence's word for nothing known


def to_ms(value_s: float | None) -> float | None:
    """Seconds to milliseconds with one decimal, for JSON (a conversion, not a text)."""
    return None if value_s is None else round(value_s * 1000, 1)


def cell(value: Any) -> str:
    """Any value for a table cell."""
    return MISSING if value is None else str(value)


def word(value: Any) -> str:
    """Any value inside a sentence. A server's own "None" (vLLM writes Python's None into its
    cache_config_info labels) reads as "none" too."""
    return NONE if value is None or value == "None" else str(value)


def ms(value_ms: float | None) -> str:
    """Milliseconds as a bare number: one decimal below 10, else whole with thousands separators."""
    if value_ms is None:
        return MISSING
    return f"{value_ms:.1f}" if value_ms < 10 else f"{value_ms:,.0f}"


def duration_ms(value_ms: float | None) -> str:
    """Milliseconds with their unit, switching to seconds from 10 s: '850 ms', '12.3 s'."""
    if value_ms is None:
        return MISSING
    return f"{value_ms:,.0f} ms" if value_ms < 10_000 else f"{value_ms / 1000:,.1f} s"


def seconds(value_s: float | None) -> str:
    """Seconds for a narrow label: '850 us', '12 ms', '1.2 s', '73 s'."""
    if value_s is None:
        return MISSING
    if value_s < 0.001:
        return f"{value_s * 1e6:.0f} us"
    if value_s < 1:
        return f"{value_s * 1000:.0f} ms"
    if value_s < 10:
        return f"{value_s:.1f} s"
    return f"{value_s:,.0f} s"


def clock(value_s: float | None) -> str:
    """A span of time to plan by, whole seconds: '45s', '3m05s', '1h02m'."""
    if value_s is None:
        return MISSING
    total = max(0, round(value_s))
    if total < 60:
        return f"{total}s"
    if total < 3600:
        return f"{total // 60}m{total % 60:02d}s"
    return f"{total // 3600}h{total % 3600 // 60:02d}m"


def pct(rate: float | None, digits: int = 1) -> str:
    """A rate as a percentage without trailing zeros: 0.03 -> '3%', 0.0297 -> '3%', 0.0049 -> '0.5%'."""
    if rate is None:
        return MISSING
    text = f"{rate * 100:.{digits}f}".rstrip("0").rstrip(".")
    return f"{text}%"


def kv(mapping: dict[str, Any] | None) -> str:
    return ", ".join(f"{k}={word(v)}" for k, v in (mapping or {}).items())
