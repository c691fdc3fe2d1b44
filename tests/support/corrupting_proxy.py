"""A test proxy that corrupts answers between hitproof and a real server, on cache hits only.

It buffers the upstream SSE stream, reads the cached tokens from the final usage chunk, and
when the request was a hit replaces the answer the way a broken restore would: another
memo's code, no code, one repeated token, or nothing (`fp_alter_unsalted`: only hits without a cache_salt, so a hit's
salted twin is right). Cold requests (the control arm, under
a fresh cache_salt) pass through untouched, so a correct hitproof raises fail-class findings.
It can also break the transport itself: HTTP 500 or a malformed chunk after N requests. And it
can drop what proves a hit, as many proxies do: `strip_usage` removes per-request cached tokens
(usage.prompt_tokens_details, timings.cache_n), `strip_all` also hides the server's /metrics.
Two modes aim at identities and evictions: `lora_swap` answers a request under adapter B (vLLM
`model: "b"`, llama.cpp a `lora` list that turns id 1 on) with the last answer adapter A gave to the
same prompt, its tokens and log-probabilities, carrying B's own usage; requests that must be cold
(a cache_salt, `cache_prompt: false`) pass untouched. `readmitted` corrupts the hits of a prompt
that had hit, then missed (it was evicted), then came back: another memo's code, on re-admission only.
Two modes compute what a wrong restore of a hybrid model's recurrent state would, on the server itself:
on a hit (cached tokens reported), the proxy sends the same request again under a fresh cache_salt with
the memo (the prompt's first part: its heading and sections, up to the blank line before the question) changed, and answers with that response's
tokens and log-probabilities under the hit's own usage. `fp_zero`: the memo removed, what a model resuming
from a zero state computes; `fp_stale`: the memo's last quarter removed (back to a sentence end), a state
checkpointed at an earlier point. Every hit is changed, a hit's twin too (it is a hit under its own salt).
`model_miss` / `model_miss_all`: no cache fault but a model that cannot recall some memos, cold and hit alike:
rotation slot 0's, control's first, the shared memo of phases 1-3 and the long prompt's (`model_miss`) or every
rotation, control, shared and long memo, re-drawn ones too (`model_miss_all`) is answered with its code's last digit wrong.
`fp_alike_pair` / `fp_alike_all`: rotation slots 0 and 1's memos (or every memo), re-drawn ones too, answer a
question alike: the first answer any of them gave to it.
`early_change` (issue 32): every hit answers with the same early change, a hit's twin too: the first word among
output tokens 2..8 becomes a word its position's top-k does not list, and every log-probability moves down by
EARLY_SHIFT nats; the text after it is the server's.
"""

from __future__ import annotations

import asyncio
import json
import re

from aiohttp import web
from support.loopback import serve_catch_all

CODE = re.compile(r"\b\d{4}-\d{4}-\d{4}\b")
MODES = ("none", "foreign", "recall_miss", "repetition", "empty", "http500", "malformed",
         "fp_foreign", "fp_alter", "fp_alter_unsalted", "fp_alike", "strip_usage", "strip_all", "send_failed_once", "lora_swap",
         "readmitted", "fp_zero", "fp_stale", "early_change", "model_miss", "model_miss_all", "fp_alike_pair",
         "fp_alike_all")
RESTATE = ("fp_zero", "fp_stale")       # a hit answered by the server from a changed memo (module docstring)
STALE_FRACTION = 0.25                   # fp_stale: how much of the memo's end the earlier state lacks
EARLY_WORDS = (" meanwhile", " harbor", " violet", " granite")   # early_change: the first one its top-k lacks
EARLY_SHIFT = 0.4
SWAP = {"a": 0, "b": 1}        # lora_swap: adapter names (vLLM models) and their llama.cpp ids; a's answers go to b


class CorruptingProxy:
    def __init__(self, upstream: str, mode: str, *, after: int = 0, names: str = "", limit: int | None = None):
        assert mode in MODES
        self.limit = limit            # for readmitted: corrupt at most this many hits (each costs controls)
        self.upstream = upstream.rstrip("/")
        self.mode = mode
        self.after = after            # for http500 / malformed: how many generation requests pass first
        self.names = names or upstream  # send_failed_once: the worker a router's message names
        self.codes: list[str] = []    # every code seen in a prompt, in order
        self.generations = 0
        self.corrupted = 0
        self.url = ""
        self.cold: dict[tuple[str, str], list[dict]] = {}   # (memo line, question) -> a cold response
        self.answers_a: dict[str, list[dict]] = {}           # lora_swap: prompt -> adapter a's last answer
        self.seen: dict[str, str] = {}                       # readmitted: prompt -> "hit" | "evicted" | "back"
        self.salts = 0                                       # fp_zero / fp_stale: fresh salts used

    async def start(self) -> "CorruptingProxy":
        self._session, self._runner, self.url = await serve_catch_all(self.handle)
        return self

    async def close(self) -> None:
        await self._runner.cleanup()
        await self._session.close()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        path = request.path
        if request.method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            return await self.generation(request, path, body)
        if self.mode == "strip_all" and path == "/metrics":
            return web.Response(status=404, text="not found")
        async with self._session.request(request.method, self.upstream + path, data=body or None,
                                         headers={"Content-Type": request.headers.get("Content-Type", "")}) as up:
            return web.Response(status=up.status, body=await up.read(),
                                content_type=up.content_type or "application/octet-stream")

    async def generation(self, request: web.Request, path: str, body: bytes) -> web.StreamResponse:
        payload = json.loads(body)
        prompt = payload.get("prompt") or "\n".join(m.get("content", "") for m in payload.get("messages", []))
        own = [c for c in CODE.findall(prompt)]
        for code in own:
            if code not in self.codes:
                self.codes.append(code)
        self.generations += 1
        if self.mode == "send_failed_once" and self.generations == self.after + 1:   # vllm-router's words
            return web.json_response({"error": {"message": f"Request failed: error sending request for url "
                                                           f"({self.names}{path})"}}, status=500)
        if self.mode == "http500" and self.generations > self.after:
            return web.json_response({"error": {"message": "proxy: engine core died"}}, status=500)
        async with self._session.post(self.upstream + path, data=body,
                                      headers={"Content-Type": "application/json"}) as up:
            raw = await up.read()
            if up.status != 200:
                return web.Response(status=up.status, body=raw, content_type="application/json")
        events = [line[5:].strip() for line in raw.decode().split("\n") if line.startswith("data:")]
        chunks = [json.loads(e) for e in events if e != "[DONE]"]
        cached = 0
        for chunk in chunks:
            usage = chunk.get("usage") or {}
            cached = ((usage.get("prompt_tokens_details") or {}).get("cached_tokens")
                      or (chunk.get("timings") or {}).get("cache_n") or cached)
        chat = path.endswith("chat/completions")
        text = "".join(self._text(c, chat) for c in chunks)
        turns = (sum(1 for m in payload.get("messages", []) if m.get("role") == "user") if chat
                 else prompt.count("\nUser:"))
        replacement = self._corrupt(text, prompt, own, cached, turns)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if self.mode == "malformed" and self.generations > self.after:
            await response.write(b"data: {\"choices\": [{\"text\": \"7\n\n")
            await response.write_eof()
            return response
        key = (prompt.split("\n", 1)[0], prompt.rsplit("Question:", 1)[-1][-160:])
        if self.mode == "lora_swap":
            out = self._swap(payload, prompt, chunks)
        elif self.mode == "readmitted":
            forced = payload.get("cache_salt") is not None or payload.get("cache_prompt") is False
            out = chunks if forced else self._readmitted(prompt, own, cached, chunks, chat)
        elif self.mode in RESTATE:
            out = await self._restate(path, payload, chunks, cached)
        elif self.mode == "early_change":
            out = self._early_change(chunks, chat) if cached else chunks
        elif self.mode in ("fp_foreign", "fp_alter"):
            out = self._fingerprint_corruption(chunks, key, cached)
        elif self.mode == "fp_alter_unsalted":      # a wrong state on the main arm's hits only: a twin is right
            salted = payload.get("cache_salt") is not None
            out = chunks if salted else self._fingerprint_corruption(chunks, key, cached)
        elif self.mode in ("fp_alike", "fp_alike_pair", "fp_alike_all"):
            out = self._alike(chunks, key)
        elif self.mode in ("strip_usage", "strip_all"):
            out = [_without_cached_tokens(c) for c in chunks]
        elif replacement is None:
            out = chunks
        else:
            self.corrupted += 1
            out = self._rechunk(chunks, replacement, chat)
        for chunk in out:
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await asyncio.sleep(0)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    def _corrupt(self, text: str, prompt: str, own: list[str], cached: int, turns: int) -> str | None:
        if self.mode in ("model_miss", "model_miss_all"):
            memo_line = prompt.split("\n", 1)[0]
            missed = any(tag in memo_line for tag in ("-rot", "-ctl", "-shared", "-long")) \
                if self.mode == "model_miss_all" else (
                any(tag in memo_line for tag in ("-rot0", "-ctl0", "-shared", "-long")) and "-recall" not in memo_line)
            code = next((c for c in own if c in text), None) if missed else None
            return text.replace(code, code[:-1] + str((int(code[-1]) + 1) % 10)) if code else None
        if not cached or self.mode in ("none", "http500", "malformed"):
            return None
        if self.mode == "foreign":
            others = [c for c in self.codes if c not in own]
            if not others or not own:
                return None
            return f" {others[0]}."
        if self.mode == "recall_miss":
            return " not stated in the memo; the ledger was closed." if own and "code" in prompt[-200:] else None
        if self.mode == "repetition":
            return " the" * 16
        if self.mode == "empty":
            return "" if turns >= 2 else None
        return None

    @staticmethod
    def _adapter(payload: dict) -> str | None:
        if payload.get("model") in SWAP:
            return payload["model"]
        for entry in payload.get("lora") or []:
            if entry.get("scale"):
                return next((name for name, i in SWAP.items() if i == entry.get("id")), None)
        return None

    def _swap(self, payload: dict, prompt: str, chunks: list[dict]) -> list[dict]:
        adapter = self._adapter(payload)
        if adapter == "a":
            self.answers_a[prompt] = chunks
            return chunks
        cold = payload.get("cache_salt") is not None or payload.get("cache_prompt") is False
        theirs = self.answers_a.get(prompt)
        if adapter != "b" or cold or theirs is None:
            return chunks
        self.corrupted += 1
        return _with_accounting(theirs, chunks)

    def _readmitted(self, prompt: str, own: list[str], cached: int, chunks: list[dict], chat: bool) -> list[dict]:
        before = self.seen.get(prompt)
        if cached:
            self.seen[prompt] = "back" if before in ("evicted", "back") else "hit"
        elif before is not None:
            self.seen[prompt] = "evicted"
        others = [c for c in self.codes if c not in own]
        if not cached or self.seen[prompt] != "back" or not others or \
                self.limit is not None and self.corrupted >= self.limit:
            return chunks
        self.corrupted += 1
        return self._rechunk(chunks, f" {others[-1]}.", chat)

    async def _restate(self, path: str, payload: dict, chunks: list[dict], cached: int) -> list[dict]:
        """fp_zero / fp_stale: a hit answered by the server from the prompt with its memo changed, under a
        fresh cache_salt (computed cold); the hit's own usage kept. Requests with no memo pass untouched."""
        if not cached:
            return chunks
        changed = json.loads(json.dumps(payload))
        if isinstance(changed.get("prompt"), str):
            text = _changed_memo(changed["prompt"], self.mode)
            if text is None:
                return chunks
            changed["prompt"] = text
        else:
            message = next((m for m in changed.get("messages") or []
                            if isinstance(m.get("content"), str) and _changed_memo(m["content"], self.mode) is not None),
                           None)
            if message is None:
                return chunks
            message["content"] = _changed_memo(message["content"], self.mode)
        self.salts += 1
        changed["cache_salt"] = f"proxy-{self.mode}-{id(self):x}-{self.salts}"
        if "cache_prompt" in changed:                   # llama.cpp: no salts; not from its cache
            changed["cache_prompt"] = False
        async with self._session.post(self.upstream + path, data=json.dumps(changed).encode(),
                                      headers={"Content-Type": "application/json"}) as up:
            raw = await up.read()
            if up.status != 200:
                return chunks
        events = [line[5:].strip() for line in raw.decode().split("\n") if line.startswith("data:")]
        computed = [json.loads(e) for e in events if e != "[DONE]"]
        self.corrupted += 1
        return _with_accounting(computed, chunks)

    def _fingerprint_corruption(self, chunks: list[dict], key: tuple[str, str], cached: int) -> list[dict]:
        """fp_foreign: a hit answers with another memo's cold response to the same question (its
        tokens and log-probabilities); fp_alter: a hit's log-probabilities are all shifted."""
        if not cached:
            self.cold.setdefault(key, chunks)
            return chunks
        if self.mode == "fp_foreign":  # (fp_alter_unsalted shifts like fp_alter)
            other = next((v for (memo, question), v in self.cold.items() if question == key[1] and memo != key[0]),
                         None)
            if other is None:
                return chunks
            self.corrupted += 1
            return _with_accounting(other, chunks)
        self.corrupted += 1
        altered = json.loads(json.dumps(chunks))
        for chunk in altered:
            for choice in chunk.get("choices") or []:
                logprobs = choice.get("logprobs") or {}
                for entry in logprobs.get("content") or []:          # chat (and llama.cpp) format
                    entry["logprob"] -= 0.3
                    for alt in entry.get("top_logprobs") or []:
                        alt["logprob"] -= 0.3
                # completions format (vLLM): token_logprobs and top_logprobs dicts
                if "token_logprobs" in logprobs:
                    logprobs["token_logprobs"] = [None if v is None else v - 0.3 for v in logprobs["token_logprobs"]]
                    logprobs["top_logprobs"] = [{k: v - 0.3 for k, v in (top or {}).items()}
                                                for top in logprobs.get("top_logprobs") or []]
        return altered

    def _early_change(self, chunks: list[dict], chat: bool) -> list[dict]:
        """early_change: the first alphabetic token among output tokens 2..8 (past them, the first one after
        token 2: an answer may open with digits) replaced by a word its top-k does not list, every
        log-probability EARLY_SHIFT lower (chosen tokens and alternatives)."""
        altered = json.loads(json.dumps(chunks))
        tokens = [token for chunk in altered for choice in chunk.get("choices") or []
                  for token in _logprob_tokens(choice.get("logprobs") or {})]
        words = [k for k, token in enumerate(tokens) if k >= 2 and token.strip().isalpha()]
        target = next((k for k in words if k <= 8), words[0] if words else None)
        index = 0
        for chunk in altered:
            for choice in chunk.get("choices") or []:
                logprobs = choice.get("logprobs") or {}
                if logprobs.get("content"):                              # chat (and llama.cpp) format
                    for entry in logprobs["content"]:
                        top = {alt.get("token") for alt in entry.get("top_logprobs") or []}
                        if index == target:
                            word = next(w for w in EARLY_WORDS if w not in top and w != entry["token"])
                            old, entry["token"] = entry["token"], word
                            entry["bytes"] = list(word.encode())
                            _replace_text(choice, chat, old, word)
                        entry["logprob"] -= EARLY_SHIFT
                        for alt in entry.get("top_logprobs") or []:
                            alt["logprob"] -= EARLY_SHIFT
                        index += 1
                elif "token_logprobs" in logprobs:                        # completions format (vLLM)
                    listed = logprobs.get("tokens") or []
                    tops = logprobs.get("top_logprobs") or [{} for _ in listed]
                    for k, token in enumerate(listed):
                        if index == target:
                            word = next(w for w in EARLY_WORDS if w not in (tops[k] or {}) and w != token)
                            listed[k] = word
                            _replace_text(choice, chat, token, word)
                        index += 1
                    logprobs["token_logprobs"] = [None if v is None else v - EARLY_SHIFT
                                                  for v in logprobs["token_logprobs"]]
                    logprobs["top_logprobs"] = [{k: v - EARLY_SHIFT for k, v in (top or {}).items()} for top in tops]
        if target is not None:
            self.corrupted += 1
        return altered

    def _alike(self, chunks: list[dict], key: tuple[str, str]) -> list[dict]:
        """Memos that look alike to the model (as on a random-weight model whose continuations barely depend
        on the prompt) answer a question with the first answer one of them gave to it (tokens and
        log-probabilities). fp_alike: every memo but a re-drawn one; fp_alike_pair: rotation slots 0 and 1's
        memos and every memo re-drawn for them (one pair no re-draw can part); fp_alike_all: every memo."""
        if self.mode == "fp_alike" and "redraw" in key[0]:
            return chunks
        if self.mode == "fp_alike_pair" and not re.search(r"-rot[01][,-]", key[0]):
            return chunks
        first = self.cold.setdefault(("alike", key[1]), chunks)
        if first is not chunks:
            self.corrupted += 1
            return _with_accounting(first, chunks)
        return chunks

    @staticmethod
    def _text(chunk: dict, chat: bool) -> str:
        out = ""
        for choice in chunk.get("choices") or []:
            out += ((choice.get("delta") or {}).get("content") or "") if chat else (choice.get("text") or "")
        return out

    @staticmethod
    def _rechunk(chunks: list[dict], text: str, chat: bool) -> list[dict]:
        template = next((c for c in chunks if c.get("choices")), {"choices": [{"index": 0}]})
        template = {k: v for k, v in template.items() if k not in ("usage", "timings")}
        tail = [{k: v for k, v in _accounting(chunks).items()} | {"choices": []}]   # usage (and timings)
        pieces = re.findall(r"\s*\S+", text) or [""]
        out = []
        for i, piece in enumerate(pieces):
            choice = {"index": 0, "finish_reason": "length" if i == len(pieces) - 1 else None}
            if chat:
                choice["delta"] = {"content": piece}
            else:
                choice["text"] = piece
            out.append({k: v for k, v in template.items() if k != "choices"} | {"choices": [choice]})
        return out + tail


def _memo_end(text: str) -> int:
    """Where a prompt's memo ends: at the first blank line that does not open a section. A memo is its
    heading line, a blank line, then sections ("Section N. ...") one a line; the question or the
    conversation follows a blank line. (Until 2026-12-04 the memo ended at the first blank line: the heading
    alone was removed, and a model that recalls still answered its code.)"""
    at = 0
    while True:
        end = text.find("\n\n", at)
        if end < 0:
            return len(text)
        if not text.startswith("Section ", end + 2):
            return end
        at = end + 2


def _changed_memo(text: str, mode: str) -> str | None:
    """`text` with its memo (heading and sections, up to the blank line before the question) removed
    (fp_zero) or cut back by STALE_FRACTION to a sentence end (fp_stale); None when the text does not start
    with a memo."""
    if not text.startswith("Memo "):
        return None
    end = _memo_end(text)
    memo, rest = text[:end], text[end:]
    if mode == "fp_zero":
        return rest
    keep = memo.rfind(". ", 0, int(len(memo) * (1 - STALE_FRACTION)))
    return memo[:keep + 1] + rest if keep > 0 else rest


def _logprob_tokens(logprobs: dict) -> list[str]:
    """A choice's output tokens, chat (and llama.cpp) or completions format."""
    if logprobs.get("content"):
        return [entry.get("token", "") for entry in logprobs["content"]]
    return list(logprobs.get("tokens") or []) if "token_logprobs" in logprobs else []


def _replace_text(choice: dict, chat: bool, old: str, new: str) -> None:
    """A token's text replaced in its chunk's text (the last place it appears: a chunk ends with its tokens)."""
    if chat:
        delta = choice.get("delta") or {}
        text = delta.get("content") or ""
        at = text.rfind(old)
        if at >= 0:
            delta["content"] = text[:at] + new + text[at + len(old):]
        return
    text = choice.get("text") or ""
    at = text.rfind(old)
    if at >= 0:
        choice["text"] = text[:at] + new + text[at + len(old):]


def _without_cached_tokens(chunk: dict) -> dict:
    chunk = json.loads(json.dumps(chunk))
    if isinstance(chunk.get("usage"), dict):
        chunk["usage"].pop("prompt_tokens_details", None)
    if isinstance(chunk.get("timings"), dict):
        chunk["timings"].pop("cache_n", None)
    return chunk


def _accounting(chunks: list[dict]) -> dict:
    """usage and timings of a response, wherever the server put them (llama.cpp: in the
    finish_reason chunk; vLLM: in a chunk of its own)."""
    found: dict = {}
    for chunk in chunks:
        for field in ("usage", "timings"):
            if chunk.get(field):
                found[field] = chunk[field]
    return found


def _with_accounting(body: list[dict], real: list[dict]) -> list[dict]:
    """Another response's chunks, carrying this response's usage and timings."""
    out = [{k: v for k, v in c.items() if k not in ("usage", "timings")} for c in body]
    out = [c for c in out if c.get("choices")]
    return out + [{"choices": [], **_accounting(real)}]
