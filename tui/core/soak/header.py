"""The run's first event: who ran what against which server (the log's header, the incident record)."""

from __future__ import annotations

import datetime as dt
import hashlib
import platform
import secrets
from typing import Any

from ... import __version__
from ..config.scenario import Scenario
from ..log.events import RunHeader
from .phases import PHASES


def run_header(scenario: Scenario, target, nonce: str, argv: list[str]) -> RunHeader:
    s = scenario
    return RunHeader(
        run_id=f"{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}",
        nonce=nonce,
        started_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        tool={"name": "hitproof", "version": __version__, "python": platform.python_version(),
              "argv": list(argv)},
        scenario={"name": s.name, "source": s.source,
                  "sha256": hashlib.sha256(s.text.encode()).hexdigest() if s.text else None,
                  "settings": s.to_dict(), "text": s.text,
                  # what each phase plans (its PhaseStarted says it again): progress and estimates
                  "plan": {name: PHASES[name].plan(s) for name in s.phases}},
        target=target_header(scenario, target),
    )


def target_header(scenario: Scenario, t) -> dict[str, Any]:
    s = scenario
    incident = dict(t.incident)
    reuse = incident.get("cache_reuse") or {}
    if incident:
        incident.setdefault("sampling", {"temperature": s.sampling.temperature, "seed": s.sampling.seed})
        incident.setdefault("hitproof_version", __version__)
    header = {"url": t.url, "engine": t.engine,
              "launch_command": t.launch_command,
              "env": t.env_of_interest,
              "sampling": {"temperature": s.sampling.temperature, "seed": s.sampling.seed},
              "cache_reuse_forced_off": bool(reuse.get("forced_off", False)),
              "cache_reuse_decided_by": reuse.get("decided_by"),
              "profile": incident.get("profile"),
              "overlays": incident.get("overlays") or [],
              "incident": incident}
    if t.replicas:
        header["replicas"] = list(t.replicas)
        header["router_metrics"] = t.router_metrics
    return header
