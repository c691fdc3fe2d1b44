"""JSON shapes of responses, matching what vLLM's OpenAI server sends."""

from __future__ import annotations

import json
from typing import Any


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode("utf-8") + b"\n\n"


DONE = b"data: [DONE]\n\n"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None) -> dict:
    """vLLM's usage object; without cached tokens (None) it has no prompt_tokens_details, as vLLM
    sends it unless started with --enable-prompt-tokens-details."""
    use = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
           "total_tokens": prompt_tokens + completion_tokens}
    if cached_tokens is not None:
        use["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return use


def completion_chunk(rid: str, created: int, model: str, text: str, finish: str | None = None,
                     stop_reason: str | None = None, logprobs: dict | None = None) -> dict:
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": logprobs,
                         "finish_reason": finish, "stop_reason": stop_reason}],
            "usage": None}


def chat_chunk(rid: str, created: int, model: str, delta: dict, finish: str | None = None,
               stop_reason: str | None = None, logprobs: dict | None = None) -> dict:
    choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
    if finish is not None:
        choice["stop_reason"] = stop_reason
    return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [choice]}


def usage_chunk(rid: str, created: int, model: str, chat: bool, use: dict) -> dict:
    kind = "chat.completion.chunk" if chat else "text_completion"
    return {"id": rid, "object": kind, "created": created, "model": model, "choices": [], "usage": use}


def completion_body(rid: str, created: int, model: str, text: str, finish: str,
                    stop_reason: str | None, logprobs: dict | None, use: dict) -> dict:
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish,
                         "stop_reason": stop_reason, "prompt_logprobs": None}],
            "usage": use}


def chat_body(rid: str, created: int, model: str, text: str, finish: str,
              stop_reason: str | None, logprobs: dict | None, use: dict) -> dict:
    return {"id": rid, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "tool_calls": []},
                         "logprobs": logprobs, "finish_reason": finish, "stop_reason": stop_reason}],
            "usage": use}


def error_body(message: str, status: int = 400, param: str | None = None) -> dict:
    kind = {400: "BadRequestError", 404: "NotFoundError"}.get(status, "InternalServerError")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def models_body(model: str, created: int, max_model_len: int, adapters: tuple[str, ...] = ()) -> dict:
    """The base model, then each LoRA adapter as vLLM lists it: a model whose `parent` is the base."""
    base = {"id": model, "object": "model", "created": created, "owned_by": "refserver",
            "root": model, "parent": None, "max_model_len": max_model_len, "permission": []}
    loras = [{"id": name, "object": "model", "created": created, "owned_by": "refserver",
              "root": f"/refserver/lora/{name}", "parent": model, "max_model_len": max_model_len, "permission": []}
             for name in adapters]
    return {"object": "list", "data": [base, *loras]}
