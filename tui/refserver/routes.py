"""The aiohttp application: vLLM-shaped endpoints over one ``Pipeline``.

Streaming sends nothing, not even headers, until prefill is over, so a client's time to
first byte is the simulated time to first token: ``uncached tokens x
prefill_us_per_token``.  Each further piece follows ``decode_ms_per_token`` later.
"""

from __future__ import annotations

import asyncio
import time
import uuid

from aiohttp import web

from . import logprobs as lp
from . import shapes
from .config import VERSION, WIDE_LOAD
from .pipeline import Admission, Pipeline, Outcome, PromptTooLong
from .metrics import render
from .protocol import BadRequest, Params, load_json, parse_chat, parse_completion, tokenize_request
from .slots import SlotRefused
from .tokenizer import detokenize, tokenize

PIPELINE = web.AppKey("pipeline", Pipeline)
STARTED = web.AppKey("started", int)


def _error(message: str, status: int = 400, param: str | None = None) -> web.Response:
    return web.json_response(shapes.error_body(message, status, param), status=status)


def _sibling(asked: object, served: str) -> bool:
    if not isinstance(asked, str) or "@" not in served:
        return False
    base = served.rsplit("@", 1)[0]
    return asked == base or asked.rsplit("@", 1)[0] == base


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": VERSION})


async def models(request: web.Request) -> web.Response:
    cfg = request.app[PIPELINE].config
    return web.json_response(shapes.models_body(cfg.model_name, request.app[STARTED], cfg.max_model_len,
                                                cfg.lora_modules))


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=render(request.app[PIPELINE]).encode("utf-8"),
                        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


async def tokenize_route(request: web.Request) -> web.Response:
    try:
        text, add_bos = tokenize_request(load_json(await request.read()))
    except BadRequest as exc:
        return _error(str(exc), param=exc.param)
    ids = [t.id for t in tokenize(text, add_bos=add_bos)]
    cfg = request.app[PIPELINE].config
    return web.json_response({"count": len(ids), "max_model_len": cfg.max_model_len, "tokens": ids})


async def detokenize_route(request: web.Request) -> web.Response:
    try:
        body = load_json(await request.read())
    except BadRequest as exc:
        return _error(str(exc))
    ids = body.get("tokens")
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        return _error("tokens must be a list of integers", param="tokens")
    return web.json_response({"prompt": detokenize(ids), "content": detokenize(ids)})


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, parse_completion)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, parse_chat)


async def _generate(request: web.Request, parse) -> web.StreamResponse:
    pipeline = request.app[PIPELINE]
    try:
        body = load_json(await request.read())
        wanted = pipeline.config.model_name
        model = body.get("model")
        # a replica serving as NAME@i (tui/refserver/replicas.py) answers for NAME and its siblings
        if model not in (None, wanted, *pipeline.config.lora_modules) and not _sibling(model, wanted):
            return _error(f"The model `{model}` does not exist.", 404, "model")
        params: Params = parse(body)
        # as vLLM: a client's X-Request-Id names the request ("cmpl-<it>"), else a random one
        rid = ("chatcmpl-" if params.chat else "cmpl-") + (request.headers.get("X-Request-Id") or uuid.uuid4().hex)
        slot = body.get("id_slot")
        slot = slot if isinstance(slot, int) and not isinstance(slot, bool) and slot >= 0 else None
        adapter = model if model in pipeline.config.lora_modules else ""
        adm = pipeline.admit(params.prompt_text, params.cache_salt, params.max_tokens, rid, slot=slot, adapter=adapter)
    except (BadRequest, PromptTooLong) as exc:
        return _error(str(exc), param=getattr(exc, "param", None))
    pipeline.running += 1
    tally = {"sent": 0, "finish": "abort"}
    try:
        await asyncio.sleep(pipeline.prefill_seconds(adm))
        pipeline.commit(adm)
        out = pipeline.outcome(adm, params.stop)
        entries = None
        if params.logprobs is not None:
            jitter = pipeline.fault.jitter(adm.prompt_tokens)
            resume = pipeline.config.resume_cost if adm.cached_tokens else 0.0
            chunked = pipeline.config.writer_cost if adm.cached_tokens and not params.cache_salt else 0.0
            wide = pipeline.config.wide_cost if adm.cached_tokens and adm.running >= WIDE_LOAD else 0.0
            entries = lp.compute(adm.digest, out.pieces, params.logprobs, jitter, resume, chunked,
                                 shift=pipeline.fault.shift(adm.cached_tokens), wide_cost=wide)
        if params.stream:
            return await _stream(request, pipeline, params, adm, out, entries, tally)
        await asyncio.sleep(max(len(out.pieces) - 1, 0) * pipeline.config.decode_ms_per_token / 1000)
        tally.update(sent=len(out.pieces), finish=out.finish_reason)
        return web.json_response(_body(pipeline, params, adm, out, entries))
    finally:
        pipeline.running -= 1
        pipeline.finish(adm, tally["sent"], tally["finish"])


def _body(pipeline: Pipeline, params: Params, adm: Admission, out: Outcome, entries) -> dict:
    use = pipeline.usage(adm, len(out.pieces))
    text = "".join(out.pieces)
    model, created = pipeline.config.model_name, int(time.time())
    if params.chat:
        logprobs = lp.chat_format(entries) if entries is not None else None
        return shapes.chat_body(adm.request_id, created, model, text, out.finish_reason,
                                out.stop_reason, logprobs, use)
    logprobs = lp.completion_format(entries, 0) if entries is not None else None
    return shapes.completion_body(adm.request_id, created, model, text, out.finish_reason,
                                  out.stop_reason, logprobs, use)


async def _stream(request: web.Request, pipeline: Pipeline, params: Params, adm: Admission,
                  out: Outcome, entries, tally: dict) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                       "Cache-Control": "no-cache"})
    rid, model, created = adm.request_id, pipeline.config.model_name, int(time.time())
    decode = pipeline.config.decode_ms_per_token / 1000

    def chunk(text: str, i: int | None, last: bool, offset: int) -> dict:
        finish = out.finish_reason if last else None
        stop = out.stop_reason if last else None
        one = [entries[i]] if entries is not None and i is not None else None
        if params.chat:
            return shapes.chat_chunk(rid, created, model, {"content": text}, finish, stop,
                                     lp.chat_format(one) if one else None)
        return shapes.completion_chunk(rid, created, model, text, finish, stop,
                                       lp.completion_format(one, offset) if one else None)

    try:
        await resp.prepare(request)     # inside: a client gone before the headers is no server traceback
        if params.chat:
            await resp.write(shapes.sse(shapes.chat_chunk(rid, created, model,
                                                          {"role": "assistant", "content": ""})))
        offset = 0
        for i, piece in enumerate(out.pieces):
            if i:
                await asyncio.sleep(decode)
            await resp.write(shapes.sse(chunk(piece, i, i == len(out.pieces) - 1, offset)))
            offset += len(piece)
            tally["sent"] = i + 1
        if not out.pieces:
            await resp.write(shapes.sse(chunk("", None, True, 0)))
        tally["finish"] = out.finish_reason
        if params.include_usage:
            use = pipeline.usage(adm, len(out.pieces))
            await resp.write(shapes.sse(shapes.usage_chunk(rid, created, model, params.chat, use)))
        await resp.write(shapes.DONE)
        await resp.write_eof()
    except ConnectionError:
        pass
    return resp


async def slot_action(request: web.Request) -> web.Response:
    """llama.cpp's POST /slots/{id}?action=save|restore|erase (tui/refserver/slots.py)."""
    pipeline = request.app[PIPELINE]
    try:
        slot = int(request.match_info["id"])
    except ValueError:
        return _error("Invalid slot ID")
    action = request.query.get("action")
    try:
        body = load_json(await request.read()) if action in ("save", "restore") else {}
        filename = body.get("filename")
        if action == "save":
            return web.json_response(pipeline.slots.save(slot, filename))
        if action == "restore":
            return web.json_response(pipeline.slots.restore(
                slot, filename, lambda tokens: pipeline.store_restored(tokens, str(filename))))
        if action == "erase":
            return web.json_response(pipeline.slots.erase(slot))
    except (BadRequest, SlotRefused) as exc:
        return _error(str(exc))
    return _error("Invalid action")


def build_app(pipeline: Pipeline) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[PIPELINE] = pipeline
    app[STARTED] = int(time.time())
    app.router.add_get("/health", health)
    app.router.add_get("/version", version)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/tokenize", tokenize_route)
    app.router.add_post("/detokenize", detokenize_route)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/slots/{id}", slot_action)
    return app
