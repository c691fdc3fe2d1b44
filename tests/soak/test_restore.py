"""The restore phase (issue 18), fast tier: llama.cpp-shaped slot save/restore on reference servers a
profile launches behind the reference router (tui/refserver/slots.py). The claims about llama.cpp
itself are shown on real llama-servers in tests/real/test_real_replicas.py."""

import httpx
import pytest

from support.cli import ROOT, report_json, run_hitproof
from tui.core.soak.phases.restore import damage
from tui.refserver import start_refserver

PROFILE = ROOT / "scenarios" / "profiles" / "refserver-replicas.toml"
RESTORE = str(ROOT / "scenarios" / "restore-quick.toml")


def profile_with(tmp_path, fault: str):
    text = PROFILE.read_text().replace("--slot-save-path {slot_dir}\"", f"--slot-save-path {{slot_dir}} --fault {fault}\"")
    assert fault in text
    path = tmp_path / f"{fault}.toml"
    path.write_text(text)
    return path


async def restore_run(tmp_path, profile):
    log = tmp_path / "run.jsonl"
    result = await run_hitproof("run", "--profile", str(profile), "--scenario", RESTORE, "--headless",
                                "--record", str(log))
    assert "Traceback" not in result.err, result.err
    return result, report_json(log)


async def test_state_that_moves_passes_clean_across_replicas_and_a_restart(tmp_path):
    result, report = await restore_run(tmp_path, PROFILE)
    assert result.code == 0, result.out + result.err
    phase = report["phases"]["restore"]
    moves = phase["restore"]["moves"]
    assert [(m["how"], m["replica"]) for m in moves] == [("on another replica", 1), ("after a restart", 0)]
    assert all(m["cached"] and m["cached"] > 0 and m["restored"] == m["saved"] for m in moves), moves
    # the clean server refuses every damaged file (its checksum), and says so
    assert {d["outcome"] for d in phase["restore"]["damages"]} == {"refused"}
    assert not [f for f in report["findings"] if f["severity"] in ("fail", "warn")]
    assert "restore after a restart: r0:" in result.out and "saved tokens restored" in result.out


async def test_a_damaged_file_that_is_accepted_and_answers_wrong_fails_naming_the_replica(tmp_path):
    result, report = await restore_run(tmp_path, profile_with(tmp_path, "slot_trust"))
    assert result.code == 1, result.out + result.err
    bad = [f for f in report["findings"] if f["kind"] == "bad_restore"]
    assert bad and all(f["severity"] == "fail" and f["replica"] == 1 for f in bad), bad
    assert {f["evidence"]["damage"] for f in bad} == {"truncated", "scrambled"}
    outcomes = {d["damage"]: d["outcome"] for d in report["phases"]["restore"]["restore"]["damages"]}
    assert outcomes == {"truncated": "accepted, answered wrong", "magic": "refused",
                        "scrambled": "accepted, answered wrong"}
    # the state that moved intact still passed its checks: only the damaged files fail
    assert all(m["cached"] > 0 for m in report["phases"]["restore"]["restore"]["moves"])


async def test_a_restore_that_reuses_nothing_is_reported_not_passed(tmp_path):
    result, report = await restore_run(tmp_path, profile_with(tmp_path, "slot_noop"))
    assert result.code == 4, result.out + result.err
    noop = [f for f in report["findings"] if f["kind"] == "restore_no_reuse"]
    assert [f["replica"] for f in noop] == [1, 0]
    assert all("silent no-op" in f["detail"] for f in noop)


async def test_the_restore_phase_on_one_server_says_it_cannot_run(tmp_path):
    server = await start_refserver(port=0)
    try:
        log = tmp_path / "one.jsonl"
        result = await run_hitproof("run", "--attach", server.url, "--scenario", RESTORE, "--headless",
                                    "--record", str(log))
    finally:
        await server.close()
    assert result.code == 4, result.out + result.err
    kinds = {f["kind"] for f in report_json(log)["findings"]}
    assert "restore_not_run" in kinds and "Traceback" not in result.err


@pytest.mark.parametrize("kind", ["truncated", "short", "magic", "flipped", "scrambled"])
def test_damage_changes_the_file_as_named(tmp_path, kind):
    source = tmp_path / "a.bin"
    original = bytes(range(256)) * 64
    source.write_bytes(original)
    size = damage(source, tmp_path / "b.bin", kind)
    damaged = (tmp_path / "b.bin").read_bytes()
    assert size == len(damaged) and damaged != original
    expected_size = {"truncated": len(original) // 2, "short": len(original) - 1}.get(kind, len(original))
    assert len(damaged) == expected_size
    with pytest.raises(ValueError, match="unknown damage"):
        damage(source, tmp_path / "c.bin", "melted")


async def test_reference_slots_answer_as_llamacpp_does(tmp_path):
    server = await start_refserver(port=0, slot_save_path=str(tmp_path))
    try:
        async with httpx.AsyncClient(base_url=server.url, trust_env=False) as c:
            prompt = "Memo alpha beta gamma. " * 40
            await c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2, "id_slot": 2})
            saved = (await c.post("/slots/2?action=save", json={"filename": "s.bin"})).json()
            assert saved["n_saved"] > 100 and saved["n_written"] == (tmp_path / "s.bin").stat().st_size
            for body, words in [({"filename": "../s.bin"}, "Invalid filename"),
                                ({"filename": "missing.bin"}, "Unable to restore slot")]:
                r = await c.post("/slots/0?action=restore", json=body)
                assert r.status_code == 400 and words in r.json()["error"]["message"]
            assert (await c.post("/slots/0?action=melt", json={})).status_code == 400
            assert (await c.post("/slots/2?action=erase")).json() == {"id_slot": 2, "n_erased": saved["n_saved"]}
    finally:
        await server.close()


@pytest.mark.parametrize("table, words", [('damages = ["melted"]', "phases.restore.damages: must list damages from"),
                                          ("damaged_slot = 0", "phases.restore.damaged_slot: must be a slot number")])
async def test_a_bad_restore_section_is_one_line_and_exit_2(tmp_path, table, words):
    bad = tmp_path / "bad.toml"
    bad.write_text(f'[scenario]\nphases = ["restore"]\n[phases.restore]\n{table}\n')
    result = await run_hitproof("run", "--attach", "http://127.0.0.1:9", "--scenario", str(bad), "--headless",
                                "--no-record")
    assert result.code == 2 and words in result.err and len(result.err.strip().splitlines()) == 1, result.err


async def test_the_prefill_is_cut_where_its_tokens_stop_being_the_questions():
    from tui.core.server.replicas import ReplicaSet
    from tui.core.soak.phases.restore import _aligned_prefix

    server = await start_refserver(port=0)
    replicas = ReplicaSet([server.url, "http://127.0.0.1:9"])
    try:
        assert await _aligned_prefix(replicas, 0, "Memo text.", "Memo text.\n\nQuestion: x") == "Memo text."
        # "tex" is not a token of "text": the slot may hold only what the question's tokens start with
        assert await _aligned_prefix(replicas, 0, "Memo tex", "Memo text.\n\nQuestion: x") == "Memo "
        # a server that cannot tokenize: the memo as it is
        assert await _aligned_prefix(replicas, 1, "Memo tex", "Memo text.") == "Memo tex"
    finally:
        await replicas.aclose()
        await server.close()
