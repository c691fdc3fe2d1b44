"""Agent conversations for the agent_replay phase: a user's JSONL capture, or a built-in generator.

A capture is one OpenAI chat request per line, in order ({"messages": [...], "tools": [...]}),
each request's messages holding the whole history so far: replaying them in order makes every
request resume from the previous one's prefix, as in the second field report.

The generator writes the same shape of conversation for a base model, completion-style: tool
schemas in the first block, a tool call and a tool result per turn (so the prompt grows by at
least one alignment block a turn), and one planted code in the first tool result that later
turns ask for again (history integrity).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config.errors import BadInput
from .text import RECALL_ANSWER_LEAD, SentenceSource

TOOL_NAMES = ["lookup_order", "reconcile_ledger", "fetch_invoice", "list_shipments", "update_status",
              "check_inventory", "open_ticket", "close_ticket", "get_carrier", "flag_discrepancy",
              "post_adjustment", "notify_team", "archive_record", "schedule_count", "transfer_stock",
              "request_approval", "compare_counts", "export_report", "lock_period", "audit_trail",
              "merge_orders", "split_shipment", "assign_owner", "estimate_delay", "verify_signature"]
STOP = ["\nUser:", "\nTool:"]
INTEGRITY_QUESTION = "What is the reconciliation code in the first tool result?"


@dataclass(frozen=True)
class AgentTurn:
    index: int                          # 0-based position in the conversation
    task: str                           # "turn" (judge repetition/empty) | "recall" (the planted code)
    prompt: str | None = None           # completions transcript
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    max_tokens: int | None = None
    stop: list[str] | None = None


@dataclass
class Conversation:
    turns: list[AgentTurn]
    code: str | None = None             # the planted code (generator only)
    opening: str = ""                   # the first request's text, shown as the "memo" in the UI
    source: str = "generator"
    notes: list[str] = field(default_factory=list)


def tool_schema(name: str, index: int) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name,
        "description": f"{name.replace('_', ' ').capitalize()} in the accounts system (tool {index + 1}).",
        "parameters": {"type": "object", "properties": {
            "reference": {"type": "string", "description": "the record to act on"},
            "site": {"type": "string", "description": "warehouse or office name"},
            "note": {"type": "string", "description": "free text for the audit trail"}},
            "required": ["reference"]}}}


def generate(*, tools: int, turns: int, growth_tokens: int, integrity_every: int, code: str, seed: str,
             nonce: str, max_tokens: int, recall_max_tokens: int, tokens_per_sentence: float = 22.0) -> Conversation:
    """A completion-style agent transcript that grows every turn (see the module docstring)."""
    filler = SentenceSource(f"agent:{seed}")
    schemas = [tool_schema(TOOL_NAMES[i % len(TOOL_NAMES)], i) for i in range(tools)]
    # The run's nonce first: no conversation ever starts from a warm cache.
    head = (f"System: Session {nonce}. You are an operations agent for the accounts office. Call a tool by writing "
            "<tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>. Tools:\n"
            + "\n".join(json.dumps(s["function"], separators=(", ", ": ")) for s in schemas) + "\n")
    transcript = head
    out: list[AgentTurn] = []
    opening = ""
    sentences = max(1, round(growth_tokens / tokens_per_sentence))
    def tool_exchange(t: int, tool: str) -> str:
        notes = " ".join(filler.next() for _ in range(sentences))
        if t == 0:        # worded as in the memos, which a small base model recalls exactly
            notes = f"The reconciliation code for this order is {code}. Keep it verbatim. {notes}"
        result: dict[str, Any] = {"reference": f"step-{t + 1}", "status": "found", "notes": notes}
        return (f" <tool_call>{{\"name\": \"{tool}\", \"arguments\": {{\"reference\": \"step-{t + 1}\"}}}}"
                f"</tool_call>\nTool: {json.dumps(result)}\n")

    for t in range(turns):
        tool = schemas[t % len(schemas)]["function"]["name"]
        integrity = t > 0 and (t % integrity_every == 0 or t == turns - 1)
        if integrity:
            transcript += f"User: {INTEGRITY_QUESTION}\nAssistant: {RECALL_ANSWER_LEAD}"
            out.append(AgentTurn(t, "recall", prompt=transcript, max_tokens=recall_max_tokens))
            # the canonical answer, then the step's tool work, so the next prompt still grows a block
            transcript += f" {code}.\nUser: Continue with {tool}.\nAssistant:" + tool_exchange(t, tool)
            continue
        transcript += f"User: Step {t + 1}: use {tool} for the records of step {t + 1} and report what you find.\n"
        transcript += "Assistant:"
        out.append(AgentTurn(t, "turn", prompt=transcript, max_tokens=max_tokens, stop=STOP))
        transcript += tool_exchange(t, tool)
        if t == 0:
            opening = transcript
    return Conversation(out, code=code, opening=opening or transcript)


def load_capture(path: str | Path, *, max_tokens: int) -> Conversation:
    """A user's capture: one OpenAI chat request per line, in conversation order."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise BadInput(f"{path}: cannot read the agent capture: {exc.strerror or exc}") from None
    turns: list[AgentTurn] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except ValueError as exc:
            raise BadInput(f"{path}:{number}: not a JSON object: {exc}") from None
        if not isinstance(request, dict) or not isinstance(request.get("messages"), list) or not request["messages"]:
            raise BadInput(f"{path}:{number}: each line must be a chat request with a non-empty \"messages\" list")
        for m in request["messages"]:
            if not isinstance(m, dict) or "role" not in m:
                raise BadInput(f"{path}:{number}: every message needs a \"role\"")
        tools = request.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise BadInput(f"{path}:{number}: \"tools\" must be a list")
        # The scenario's max_tokens, not the capture's: a replay judges the start of each answer.
        turns.append(AgentTurn(len(turns), "turn", messages=request["messages"], tools=tools,
                               max_tokens=max_tokens))
    if len(turns) < 2:
        raise BadInput(f"{path}: an agent capture needs at least two requests (found {len(turns)})")
    opening = json.dumps(turns[0].messages, ensure_ascii=False)[:20000]
    return Conversation(turns, opening=opening, source=str(path))
