"""The incident record (header target.incident; tui.core.server.incident) as rows and as text."""

from __future__ import annotations

from . import fmt
from .report import RunReport


def incident_rows(report: RunReport) -> list[tuple[str, str]]:
    """(label, value) for every fact the second field report says an operator should log; empty
    when the log has no incident record (older logs, or a soak started without the probe)."""
    target = (report.header.target if report.header else None) or {}
    inc = target.get("incident") or {}
    if not inc:
        return []
    server, model = inc.get("server") or {}, inc.get("model") or {}
    spec, cache, reuse = inc.get("speculative") or {}, inc.get("cache_config") or {}, inc.get("cache_reuse") or {}
    seen = report.server.cache_config if report.server else {}
    block = cache.get("block_size") if cache.get("block_size") not in (None, "unknown") else seen.get("block_size")
    mamba = cache.get("mamba_cache_mode") if cache.get("mamba_cache_mode") not in (None, "unknown") \
        else seen.get("mamba_cache_mode")
    profile = inc.get("profile") or {}
    rows = [
        ("profile", f"{fmt.word(profile.get('name'))} ({fmt.word(profile.get('source'))}, sha256 "
                    f"{str(profile.get('sha256') or 'unknown')[:12]})"
         if profile else "none"),
        ("server version", str(server.get("version") or "unknown")),
        ("server commit", f"{server.get('commit') or 'unknown'} ({server.get('commit_source') or 'no source'})"),
        ("system_fingerprint", str(server.get("system_fingerprint") or "not reported")),
        ("model", f"{model.get('served') or 'unknown'}" + (f" ({model.get('root')})" if model.get("root") else "")),
        ("quantization", f"{model.get('quantization') or 'unknown'}"
         + (f" (from {model.get('quantization_source')})" if model.get("quantization_source") not in (None, "none")
            else "")),
        ("speculative method", str(spec.get("method") or "unknown")),
        ("drafter", str(spec.get("drafter") or "unknown")),
        ("speculative tokens", fmt.word(spec.get("num_speculative_tokens", "unknown"))),
        ("block size", str(block or "unknown")),
        ("mamba cache mode", str(mamba or ("n/a" if seen or cache.get("labels") else "unknown"))),
        ("cache reuse forced off", ("yes" if reuse.get("forced_off") else "no")
         + (f" ({reuse.get('decided_by')})" if reuse.get("decided_by") else "")),
        ("launch command", inc.get("launch_command") or "attached (not launched by hitproof)"),
        ("environment", fmt.kv(inc.get("env")) or "none recorded"),
        ("overlays", "; ".join(f"{fmt.word(o.get('path'))} sha256 {fmt.word(o.get('sha256'))}"
                               for o in inc.get("overlays") or [] if isinstance(o, dict))
         or "none"),
        ("sampling", fmt.kv(inc.get("sampling")) or "default"),
        ("seed", f"{fmt.word(inc.get('seed'))} (scenario text seed {fmt.word(inc.get('scenario_seed'))})"),
        ("hitproof", str(inc.get("hitproof_version") or "unknown")),
    ]
    if (inc.get("probe") or {}).get("probe_error"):
        rows.append(("probe", str(inc["probe"]["probe_error"])))
    return rows


def incident_text(report: RunReport) -> str:
    rows = incident_rows(report)
    if not rows:
        return ""
    width = max(len(k) for k, _ in rows)
    return "incident record:\n" + "".join(f"  {k:<{width}}  {v}\n" for k, v in rows)
