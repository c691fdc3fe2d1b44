"""Regenerate the pictures the README and the manual show (screenshots/, which docs/screenshots links to).

    python docs/screenshots.py           # the app and the HTML report: Pilot tests on the reference server,
                                         # and headless Chromium (`hitproof setup --test-deps` installs it)
    python docs/screenshots.py --real    # also the live app on the embedded real vLLM (minutes)
    python docs/screenshots.py --list    # which test renders which picture

Nobody draws them by hand: each picture is written by the test that drives the app (Textual's Pilot) or
renders the report, so a picture shows what the program shows. This runs exactly those tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# picture -> the test that writes it
SHOTS = {
    "foreign-code-detail.svg": "tests/app/test_app.py::test_foreign_code_is_highlighted_at_its_offset",
    "foreign-code-run.svg": "tests/app/test_app.py::test_foreign_code_is_highlighted_at_its_offset",
    "divergence-detail.svg": "tests/app/test_app.py::test_divergence_detail_and_isolation_verdict",
    "isolation-verdict.svg": "tests/app/test_app.py::test_divergence_detail_and_isolation_verdict",
    "compact-64-slots.svg": "tests/app/test_app.py::test_64_slots_use_the_compact_view",
    "matrix-running.svg": "tests/app/test_matrix_app.py::test_rows_fill_the_running_soak_is_live_and_enter_replays_a_row",
    "matrix-done.svg": "tests/app/test_matrix_app.py::test_rows_fill_the_running_soak_is_live_and_enter_replays_a_row",
    "matrix-replay.svg": "tests/app/test_matrix_app.py::test_rows_fill_the_running_soak_is_live_and_enter_replays_a_row",
    "report-html.png": "tests/report/test_html_report.py::test_chromium_renders_the_real_vllm_report_with_its_charts",
    "report-html-findings.png":
        "tests/report/test_html_report.py::test_foreign_codes_are_marked_at_their_offsets_and_on_the_timeline",
    # the real tier: starts the embedded vLLM (Gemma 3 270M on the CPU)
    "clean-rotation-vllm.svg": "tests/real/test_real_vllm.py::test_app_on_real_vllm_and_its_replay_show_the_same",
}


def main(argv: list[str]) -> int:
    if "--list" in argv:
        for name, node in SHOTS.items():
            print(f"screenshots/{name}: {node}")
        return 0
    real = "--real" in argv
    nodes = sorted({node for node in SHOTS.values() if real or not node.startswith("tests/real/")})
    return subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *nodes], cwd=ROOT)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
