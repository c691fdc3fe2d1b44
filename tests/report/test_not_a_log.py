"""`hitproof report` (every format) and `hitproof replay` on something that is not a hitproof log:
one line on standard error, exit 2, nothing on standard output. A real log next to them reads."""

from __future__ import annotations

import pytest

from support.cli import run_hitproof
from tui.cli import main
from tui.core.log.events import RunFinished, RunHeader
from tui.core.log.recorder import encode_line

FORMATS = ("text", "markdown", "json", "junit", "html")
NOT_LOGS = {
    "empty": (b"", "empty file, not a hitproof log"),
    "blank first line": (b"\n" + encode_line(RunHeader(seq=1)), "not a hitproof log (the first line is blank)"),
    "binary": (b"\x7fELF\x02\x01\x01\x00\x00\x00" + bytes(range(256)) * 8, "not a hitproof log (binary data)"),
    "not UTF-8": (b"\xff\xfe{\"type\":\"header\"}\n", "not a hitproof log (binary data)"),
    "text": (b"hello world\nsecond line\n", "not a hitproof log (the first line is not a JSON event)"),
    "JSON, not an event": (b'{"hello": 1}\n', "not a hitproof log (the first line is not a JSON event)"),
    # the first line is of a type report's filter skips (answer deltas): it must still be checked
    "no header, a delta first": (b'{"type":"delta","seq":1,"t":0,"request":1,"text":"x"}\n'
                                 + encode_line(RunFinished(seq=2, verdict="pass", exit_code=0)),
                                 "not a hitproof log (first line is not a header)"),
    "no header, a run_end first": (encode_line(RunFinished(seq=1, verdict="pass", exit_code=0)),
                                   "not a hitproof log (first line is not a header)"),
    "a header cut short": (encode_line(RunHeader(seq=1))[:40], "not a hitproof log (the first line is cut short"),
}


def run_main(capfd, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capfd.readouterr()
    return code, out, err


@pytest.mark.parametrize("kind", sorted(NOT_LOGS))
def test_report_and_replay_refuse_what_is_not_a_log_in_one_line(tmp_path, capfd, kind):
    data, message = NOT_LOGS[kind]
    path = tmp_path / "thing.jsonl"
    path.write_bytes(data)
    for args in [("report", str(path), "--format", f) for f in FORMATS] + [("replay", str(path))]:
        code, out, err = run_main(capfd, *args)
        assert code == 2, (args, out, err)
        assert out == "", (args, out)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"hitproof: error: {path}: {message}"), (args, err)


def test_a_folder_and_a_missing_file_are_one_line_too(tmp_path, capfd):
    folder = tmp_path / "logs"
    folder.mkdir()
    for path, why in ((folder, "Is a directory"), (tmp_path / "missing.jsonl", "No such file or directory")):
        for args in [("report", str(path), "--format", f) for f in FORMATS] + [("replay", str(path))]:
            code, out, err = run_main(capfd, *args)
            assert code == 2 and out == "", (args, out, err)
            assert err.strip() == f"hitproof: error: cannot open log {path}: {why}", (args, err)


def test_a_real_log_with_only_a_header_still_reports(tmp_path, capfd):
    path = tmp_path / "header-only.jsonl"
    path.write_bytes(encode_line(RunHeader(seq=1, run_id="r1")))
    code, out, err = run_main(capfd, "report", str(path), "--format", "json")
    assert code == 0 and '"verdict": "incomplete"' in out and "error" not in err


async def test_no_traceback_through_the_real_command(tmp_path):
    path = tmp_path / "ls.jsonl"
    path.write_bytes(NOT_LOGS["binary"][0])
    for args in (("report", str(path)), ("replay", str(path))):
        result = await run_hitproof(*args, timeout=60)
        assert result.code == 2 and "Traceback" not in result.err and result.out == ""
        assert result.err.strip() == f"hitproof: error: {path}: not a hitproof log (binary data)"
