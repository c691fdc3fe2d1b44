"""Which LoRA adapters a server serves, and the request fields that pick one (or the base model).

vLLM (and the reference server) serve each adapter as a model of its own: `/v1/models` lists it
with a `parent` (the base model), and a request picks it with `model: "<name>"`. llama.cpp loads
adapters at start-up (`--lora`, `--lora-scaled`) and lists them at `GET /lora-adapters`
(`[{"id": 0, "path": ..., "scale": ...}]`); a request picks them with a `lora` list of ids and
scales, and one *without* the list gets the server's default set. An explicit list always names
every id (the ones not used at scale 0), so "base" can be said explicitly on llama.cpp too.

An identity is what the partition phase pairs: a name for the report, the model to send and the
extra body fields (tui.core.server.wire.RequestSpec.extra).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

BASE = "base"
SELECTIONS = ("explicit", "default")   # how the base model is asked for: named, or no adapter field at all


@dataclass(frozen=True)
class Identity:
    name: str                                    # "base", or the adapter's name
    model: str                                   # the `model` field to send
    extra: dict[str, Any] = field(default_factory=dict)   # further body fields (llama.cpp `lora`)
    adapter: bool = True                         # False for the base model
    unnamed: bool = False                        # the base model asked for with no adapter field (llama.cpp)
    label: str = ""                              # how a sentence names it, when not by the rules below

    def describe(self) -> str:
        if self.label:
            return self.label
        if not self.adapter:
            return f"the base model {self.model}" + (" (no adapter field)" if self.unnamed else "")
        return f"adapter {self.name}"


def adapters_from_models(models: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """vLLM-style: the models that name a `parent` are adapters of it."""
    return [{"name": m["id"], "model": m["id"], "extra": {}, "parent": m.get("parent")}
            for m in models if m.get("parent") and m.get("id") and m.get("id") != m.get("parent")]


def adapters_from_llamacpp(listed: Any) -> list[dict[str, Any]]:
    """llama.cpp's GET /lora-adapters: every id, named by its file (without .gguf) less what every
    file name shares ("gemma3-270m-lora-a-f32", "...-b-f32": "a", "b"; `file` keeps the whole stem)."""
    if not isinstance(listed, list):
        return []
    entries = sorted((e for e in listed if isinstance(e, dict) and isinstance(e.get("id"), int)),
                     key=lambda e: e["id"])
    ids = [e["id"] for e in entries]
    stems = [PurePath(str(e.get("path"))).stem if e.get("path") else f"lora{e['id']}" for e in entries]
    names = _distinct_parts(stems)
    out = []
    for e, stem, name in zip(entries, stems, names):
        lora = [{"id": i, "scale": 1.0 if i == e["id"] else 0.0} for i in ids]
        out.append({"name": name, "file": stem, "id": e["id"], "model": "", "extra": {"lora": lora},
                    "default_scale": e.get("scale")})
    return out


def _distinct_parts(stems: list[str]) -> list[str]:
    """The stems less their common prefix and suffix (cut at a separator), when what is left is
    non-empty and still tells them apart; else the stems."""
    if len(stems) < 2 or len(set(stems)) != len(stems):
        return stems
    prefix = os.path.commonprefix(stems)
    suffix = os.path.commonprefix([s[::-1] for s in stems])[::-1]
    cut = max((prefix.rfind(c) for c in "-_. "), default=-1) + 1
    tail = min((i for i in (suffix.find(c) for c in "-_. ") if i >= 0), default=len(suffix))
    names = [s[cut:len(s) - (len(suffix) - tail)] for s in stems]
    if all(names) and len(set(names)) == len(names) and names[0] != BASE and BASE not in names:
        return names
    return stems


def identities(adapters: list[dict[str, Any]], base_model: str, dialect: str, *, wanted: tuple[str, ...] = (),
               base: bool = True, selection: str = "explicit", limit: int = 2) -> list[Identity]:
    """The identities to pair: the base model (when `base`), then the wanted adapters (by name, or for
    llama.cpp by id too), else the first `limit` the server serves. KeyError names an unknown one."""
    chosen: list[dict[str, Any]] = []
    if wanted:
        for name in wanted:
            match = next((a for a in adapters if name in (a["name"], a.get("file"), str(a.get("id")))), None)
            if match is None:
                raise KeyError(name)
            chosen.append(match)
    else:
        chosen = adapters[:limit]
    out = []
    if base and chosen:
        extra: dict[str, Any] = {}
        unnamed = dialect == "llamacpp" and selection == "default"
        if dialect == "llamacpp" and not unnamed:
            extra = {"lora": [{"id": e["id"], "scale": 0.0} for e in sorted(adapters, key=lambda a: a["id"])]}
        out.append(Identity(BASE, base_model, extra, adapter=False, unnamed=unnamed))
    for a in chosen:
        out.append(Identity(a["name"], a.get("model") or base_model, dict(a.get("extra") or {})))
    return out


def label_of(model: str, extra: dict[str, Any] | None, base_model: str, adapters: list[dict[str, Any]]) -> str | None:
    """Which identity a request runs under, for the log: None for the plain base model; the adapter's
    name; for a llama.cpp `lora` list the adapters it turns on ("base" when none is)."""
    lora = (extra or {}).get("lora")
    if isinstance(lora, list):
        names = {a.get("id"): a["name"] for a in adapters if "id" in a}
        on = [names.get(e.get("id"), f"lora{e.get('id')}") for e in lora
              if isinstance(e, dict) and (e.get("scale") or 0) != 0]
        return "+".join(on) if on else BASE
    if model and model != base_model:
        return model
    return None
