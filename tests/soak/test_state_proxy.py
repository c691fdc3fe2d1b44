"""The physical wrong-state proxies (tests/support/corrupting_proxy.py, fp_zero and fp_stale): on every hit
the server itself computes the answer from a changed memo (removed: a zero state; its last quarter cut:
a stale state), under a fresh salt, and the hit's own usage is kept. They are what benchmarks/gpu/ runs
on the real hybrid vLLM; here on the reference server, whose hits are exact: each must end a hybrid soak
with exit 1 and fail-class findings, and the proxy passing everything through must leave it clean."""

from __future__ import annotations

import pytest

from support.cli import report_json, run_hitproof, scenario
from support.corrupting_proxy import CorruptingProxy, _changed_memo
from tui.core.evidence.text import memo_heading, section_heading
from tui.refserver import start_refserver

# hybrid-quick's evidence on two of its phases (the full soak runs on the GPU): a hit and its repeat, then
# partial-prefix hits across rotating memos
SMALL = """
[scenario]
phases = ["cold_hit", "rotation"]
seed = 7
[evidence]
memo_tokens = 1500
codes = false
fingerprints = true
fingerprint_tokens = 12
fingerprint_top_k = 5
fingerprint_tolerance = 0.05
recall_max_tokens = 12
summary_max_tokens = 12
[sampling]
temperature = 0.0
seed = 1234
[phases.rotation]
slots = 4
rounds = 3
memo_tokens = 1200
"""
# as MemoText.render writes it: the heading line, a blank line, sections one a line (the code in section 2)
MEMO = (memo_heading("m01", "abcdef") + section_heading(1) + "One sentence here. Two sentences here."
        + section_heading(2) + "The reconciliation code for this memo is 1234-5678-9012. Keep it verbatim."
        + " Three sentences here. Four sentences here.")
QUESTION = "\n\nQuestion: Summarize this memo.\nAnswer:"
PROMPT = MEMO + QUESTION


def test_the_memo_is_removed_or_cut_back_and_the_question_kept():
    assert "\n\nSection 1. " in PROMPT                   # the blank line after the heading opens a section
    assert _changed_memo(PROMPT, "fp_zero") == QUESTION    # heading and every section gone, the code too
    stale = _changed_memo(PROMPT, "fp_stale")
    assert stale.endswith(QUESTION)
    memo = stale[:-len(QUESTION)]
    assert PROMPT.startswith(memo) and memo.endswith(".") and "Four sentences" not in memo
    assert len(memo) >= 0.5 * len(MEMO) and "Section 2." in memo
    transcript = MEMO + "\n\nUser: Note 1: audit. Which team?\nAssistant:"     # the conversation phase's
    assert _changed_memo(transcript, "fp_zero") == "\n\nUser: Note 1: audit. Which team?\nAssistant:"
    assert _changed_memo("User: no memo here", "fp_zero") is None


def test_early_change_replaces_an_early_word_outside_the_top_k_and_moves_every_logprob():
    chunks = [{"choices": [{"index": 0, "text": t, "logprobs": {"tokens": [t], "token_logprobs": [-0.1],
                                                                 "top_logprobs": [{t: -0.1, " meanwhile": -2.0}]}}]}
              for t in (" The", " memo", ",", " says", " more")]
    out = CorruptingProxy("http://127.0.0.1:9", "early_change")._early_change(chunks, chat=False)
    assert "".join(c["choices"][0]["text"] for c in out) == " The memo, harbor more"   # token 3: the first word from 2
    assert out[3]["choices"][0]["logprobs"]["tokens"] == [" harbor"]                  # " meanwhile" is in its top-k
    assert all(c["choices"][0]["logprobs"]["token_logprobs"] == [pytest.approx(-0.5)] for c in out)
    assert out[0]["choices"][0]["logprobs"]["top_logprobs"][0][" meanwhile"] == pytest.approx(-2.4)
    chat = [{"choices": [{"index": 0, "delta": {"content": t}, "logprobs": {"content": [
        {"token": t, "logprob": -0.2, "top_logprobs": [{"token": t, "logprob": -0.2}]}]}}]}
        for t in ("A", " b", " c")]
    changed = CorruptingProxy("http://127.0.0.1:9", "early_change")._early_change(chat, chat=True)
    assert [c["choices"][0]["delta"]["content"] for c in changed] == ["A", " b", " meanwhile"]
    assert changed[2]["choices"][0]["logprobs"]["content"][0]["logprob"] == pytest.approx(-0.6)


def test_early_change_on_an_answer_opening_with_digits_changes_its_first_word_after_them():
    """A fresh-clone CI (stop 37): the only hit answered with a code, no word among tokens 2..8, and the proxy
    changed nothing. Past token 8 the first word after token 2 is changed; an answer with no word is left."""
    digits = [" 6", "5", "1", "1", "-", "2", "7", "4", "6", ".", "\n", "User", ":"]
    chunks = [{"choices": [{"index": 0, "text": t, "logprobs": {"tokens": [t], "token_logprobs": [-0.1],
                                                                 "top_logprobs": [{t: -0.1}]}}]} for t in digits]
    proxy = CorruptingProxy("http://127.0.0.1:9", "early_change")
    out = proxy._early_change(chunks, chat=False)
    assert "".join(c["choices"][0]["text"] for c in out) == " 6511-2746.\n meanwhile:" and proxy.corrupted == 1
    proxy._early_change(chunks[:11], chat=False)
    assert proxy.corrupted == 1                    # nothing to change: not counted


# fp_stale cuts the memo's last quarter. The reference server's fingerprint follows a memo's head and its
# question (tui/refserver/model.py), not its end, so the stale memo shows only where the answer needs that
# end: the code, placed at 90% of the memo and asked for.
STALE = SMALL.replace("codes = false", "codes = true\ncode_position = 0.9")


async def soak_through(tmp_path, mode: str) -> tuple[int, dict, str, CorruptingProxy]:
    handle = await start_refserver(port=0, seed=0)
    proxy = await CorruptingProxy(handle.url, mode).start()
    log = tmp_path / f"{mode}.jsonl"
    text = STALE if mode == "fp_stale" else SMALL
    try:
        result = await run_hitproof("run", "--attach", proxy.url, "--scenario", str(scenario(tmp_path, text)),
                                    "--headless",
                                    "--record", str(log), timeout=300)
    finally:
        await proxy.close()
        await handle.close()
    return result.code, report_json(log), result.out + result.err, proxy


@pytest.mark.parametrize("mode", ["fp_zero", "fp_stale", "early_change"])
async def test_a_wrong_state_computed_by_the_server_fails(tmp_path, mode):
    code, report, out, proxy = await soak_through(tmp_path, mode)
    assert proxy.corrupted > 0
    assert code == 1, out
    fails = [f for f in report["findings"] if f["severity"] == "fail"]
    assert fails, report["findings"]
    assert ({"fingerprint_mismatch", "recall_miss"} if mode == "fp_stale" else {"fingerprint_mismatch"}) & {f["kind"] for f in fails}
    # every hit was changed, its twin too: where a twin was made, it is as wrong as the hit; and the resume
    # calibration's hits were changed as well, so nothing is put down to resuming (issue 32)
    if mode == "fp_stale":
        # the cut memo's fingerprints equal the full memo's on this server (its head and question), so a
        # calibration resume or a hit answering a fingerprint question is changed in nothing it measures: some
        # may be put down to resuming. What must hold is the fail on the hits whose code was cut.
        assert "recall_miss" in {f["kind"] for f in fails}
        return
    twinned = [f for f in fails if (f.get("evidence") or {}).get("twin_verdict")]
    assert all(f["evidence"]["twin_verdict"] in ("far_with_twin", "no_resume_excuse") for f in twinned)
    assert not [f for f in report["findings"] if f["kind"] == "resume_cost"]
    if mode == "early_change":
        calibrated = report["resume"]
        assert calibrated["grid"] and calibrated["void"] and not calibrated["allowed"]


async def test_the_proxy_passing_everything_through_stays_clean(tmp_path):
    code, report, out, proxy = await soak_through(tmp_path, "none")
    assert proxy.corrupted == 0
    assert code == 0, out
    assert [f for f in report["findings"] if f["severity"] == "fail"] == []
