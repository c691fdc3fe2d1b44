"""One request as the soak saw it (spec, answer, checks, what is known of its cached tokens), the
answer's text coalesced for the event stream, and small helpers the soak's parts share."""

from __future__ import annotations

import asyncio
import collections
import hashlib
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Protocol

import orjson

from ..evidence.memos import Memo
from ..log.events import AnswerDelta
from ..server.answer import TEXT_EVERY_NS
from ..server.client import Completion, RequestSpec
from ..checks.answers import ALL_JUDGES
from ..config.scenario import Scenario
from ..evidence.codes import Registry
from ..log.events import Event, ServerInfo
from .proof import UNKNOWN, CacheProof

DELTA_INTERVAL = TEXT_EVERY_NS / 1e9   # seconds between coalesced answer deltas per request, in the app (the reader's)


class DeltaCoalescer:
    """The answer text as it streams, emitted as AnswerDelta events at most every `every` seconds per
    request (the UI never gets one event per token). Call it with each piece of text. What is left when
    the stream ends is not emitted: the request's RequestFinished holds the whole text."""

    __slots__ = ("emit", "request", "every", "pending", "last")

    def __init__(self, emit, request: int, every: float = DELTA_INTERVAL):
        self.emit = emit
        self.request = request
        self.every = every
        self.pending: list[str] = []
        self.last = time.monotonic()

    def __call__(self, text: str) -> None:
        pending = self.pending
        pending.append(text)
        now = time.monotonic()
        if now - self.last >= self.every:
            self.emit(AnswerDelta(request=self.request, text="".join(pending)))
            pending.clear()
            self.last = now


@dataclass
class Record:
    request: int
    phase: str
    task: str
    spec: RequestSpec
    memo: Memo | None
    slot: int | None
    round: int | None
    turn: int | None
    completion: Completion
    checks: dict[str, Any]
    proof: CacheProof = UNKNOWN          # what is known of its cached tokens, and how
    cold_tolerance: int = 0              # tokens it may reuse and still be cold (before the nonce)
    findings: list[tuple[str, str]] = field(default_factory=list)   # (kind, severity) judged on it
    concurrent: int = 0                  # other requests streaming when this one was sent
    company: int = 0                     # other requests streaming at any time while this one was (0: alone)
    replica: int | None = None           # the replica that served it, behind a router (None: unknown)
    replica_source: str = ""             # header | model | counter | direct
    routed_away: bool = False            # served by a replica that had never served its memo

    @property
    def text(self) -> str:
        return self.completion.text

    @property
    def cached(self) -> int | None:
        """Cached tokens when known exactly (reported, or attributed exactly); None when unknown."""
        return self.proof.exact

    @property
    def hit(self) -> bool:
        """A proven hit: more cached tokens than the template a cold request shares (those before the
        run nonce), by the server's report or its counter."""
        return self.proof.low > self.cold_tolerance

    @property
    def cold(self) -> bool:
        """Proven cold: at most the tokens before the run nonce were reused."""
        return self.proof.cold(self.cold_tolerance)


class Overlap:
    """Who streamed beside whom: each request's count of others in flight when it was sent (`concurrent`),
    and of others in flight at any time while it was (`company`; 0: it ran alone)."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.sent = 0

    def enter(self) -> tuple[int, int]:
        mark = (self.in_flight, self.sent)
        self.in_flight += 1
        self.sent += 1
        return mark

    def leave(self, mark: tuple[int, int]) -> int:
        """The request is done streaming: its company."""
        self.in_flight -= 1
        others, sent_before = mark
        return others + self.sent - sent_before - 1


async def concurrently(*coroutines):
    """gather() that cancels the siblings when one fails, so no slot outlives the phase."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def cached_words(proof: CacheProof) -> str:
    if proof.exact is not None:
        return f"{proof.exact} cached tokens"
    if proof.source == "unknown":
        return "cached tokens unknown"
    return f"{proof.low}-{proof.high} cached tokens (by counter)" if proof.high is not None \
        else f"at least {proof.low} cached tokens (by counter)"


def prompt_text(spec: RequestSpec) -> str:
    return spec.prompt if spec.prompt is not None else orjson.dumps(spec.messages).decode()


def shared_chars(a: str, b: str) -> int:
    """How many leading characters two prompts share. Compared in place (startswith at an offset), never
    by slicing both from the start: galloping from the front, so prompts that part early cost two short
    compares, then halving the stretch where they part."""
    if len(a) > len(b):
        a, b = b, a
    if b.startswith(a):
        return len(a)
    lo, hi = 0, len(a)                   # a[:lo] is shared, a[:hi] is not
    step = 64
    while lo + step < hi:
        if not b.startswith(a[lo:lo + step], lo):
            hi = lo + step
            break
        lo += step
        step *= 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if b.startswith(a[lo:mid], lo):
            lo = mid
        else:
            hi = mid
    return lo


KEEP_KEYS = 2048          # prompt keys kept, by request spec (a lineage walks back through recent records)
_keys: collections.OrderedDict[int, tuple[RequestSpec, str]] = collections.OrderedDict()
_keys_by_text: collections.OrderedDict[int, tuple[str, str, str]] = collections.OrderedDict()


def prompt_key(spec: RequestSpec) -> str:
    """The prompt and who computes it (model, adapter fields), not the salt: a salted re-send is the
    same prompt cold. Kept per spec (the entry holds the spec, so its id names it while kept): the judge and
    the twins' lineages ask 14 times a request, each a SHA-1 of the whole prompt (H100, 2026-12-05)."""
    kept = _keys.get(id(spec))
    if kept is not None and kept[0] is spec:
        return kept[1]
    # each send is a copy of its phase's spec (its own request id) holding the same prompt string: a
    # completions prompt's key is kept by that string too (a SHA-1 of 6-8 KB a request otherwise)
    text = spec.prompt if spec.prompt is not None and not spec.extra else None
    if text is not None:
        same = _keys_by_text.get(id(text))
        if same is not None and same[0] is text and same[1] == spec.model:
            _keep(_keys, id(spec), (spec, same[2]))
            return same[2]
    body = prompt_text(spec)
    if spec.extra:
        body += "\x00" + orjson.dumps(spec.extra, option=orjson.OPT_SORT_KEYS).decode()
    if spec.model:
        body += "\x00model:" + spec.model
    key = hashlib.sha1(body.encode()).hexdigest()
    _keep(_keys, id(spec), (spec, key))
    if text is not None:
        _keep(_keys_by_text, id(text), (text, spec.model, key))
    return key


KEEP_JOINED = 512        # joined prompts kept, with their memo texts (8 MB at most)
_joined: collections.OrderedDict[tuple[int, str], tuple[str, str]] = collections.OrderedDict()


def joined_prompt(context: str, suffix: str) -> str:
    """context + suffix, the same string each time a memo is asked the same question. prompt_key keeps a
    prompt's key by its string, and rotation asks each memo anew every round: a new 6-8 KB string a request
    was a SHA-1 of it each time (about 1.5% of hitproof's CPU at 128 streams, reference server, 2026-12-06)."""
    key = (id(context), suffix)
    kept = _joined.get(key)
    if kept is not None and kept[0] is context:
        return kept[1]
    joined = context + suffix
    _keep(_joined, key, (context, joined), KEEP_JOINED)
    return joined


def _keep(kept: collections.OrderedDict, key, value: tuple, most: int = KEEP_KEYS) -> None:
    kept[key] = value
    if len(kept) > most:
        kept.popitem(last=False)


class Sender(Protocol):
    """What the judge needs of the Requester: send a control, a fresh salt, emit findings."""

    scenario: Scenario
    registry: Registry
    server: ServerInfo

    def emit(self, event: Event) -> Event: ...

    def writer_of(self, record: Record) -> Record | None: ...

    async def prefix_text(self, spec: RequestSpec, tokens: int) -> str | None: ...

    def fresh_salt(self) -> str: ...

    def finding(self, state: Any, kind: str, severity: str, record: Record | None = None, *,
                offset: int | None = None, detail: str = "", **evidence: Any) -> None: ...

    async def send(self, state: Any, spec: RequestSpec, *, task: str, memo: Memo | None = None,
                   slot: int | None = None, round: int | None = None, turn: int | None = None,
                   expect: str = "any", arm: str = "main", of_request: int | None = None,
                   judges: Iterable[str] = ALL_JUDGES, control: bool = True,
                   replica: int | None = None, fingerprints: bool = True) -> Record: ...
