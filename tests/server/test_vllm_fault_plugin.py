"""The in-engine fault plugin's contract without a vLLM: the wheel vLLM discovers, the variable that arms it,
the one line an unknown fault stops the start with. tests/real/test_real_vllm_faults.py runs it inside vLLM."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

import pytest

from tui.embedded import vllm_faults
from tui.embedded.vllm_fault_plugin import FAULTS, VARIABLE


def test_the_wheel_declares_the_general_plugin_entry_point(tmp_path):
    path = vllm_faults.wheel(tmp_path)
    assert path.name == f"hitproof_vllm_faults-{vllm_faults.version()}-py3-none-any.whl"
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        info = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        assert zf.read(info).decode() == "[vllm.general_plugins]\nhitproof_faults = hitproof_vllm_faults:register\n"
        assert zf.read("hitproof_vllm_faults.py") == vllm_faults.SOURCE.read_bytes()
        record = zf.read(next(n for n in names if n.endswith("RECORD"))).decode()
        assert all(name in record for name in names)
    # the same source gives the same bytes (an installed plugin is reinstalled only when it changed)
    again = vllm_faults.wheel(tmp_path / "again")
    assert again.read_bytes() == path.read_bytes()


def _register(env_value: str | None) -> subprocess.CompletedProcess:
    """register() in a fresh interpreter, as vLLM calls it, with no vLLM installed."""
    env = {k: v for k, v in os.environ.items() if k != VARIABLE}
    if env_value is not None:
        env[VARIABLE] = env_value
    code = ("import sys; sys.path.insert(0, %r); import vllm_fault_plugin as p; p.register(); "
            "print('patched' if p._patched else 'inert', 'vllm' in sys.modules)") % str(vllm_faults.SOURCE.parent)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("value", [None, "", "  "])
def test_without_a_fault_named_the_plugin_patches_nothing_and_imports_no_vllm(value):
    done = _register(value)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["inert", "False"]
    assert done.stderr == ""


def test_an_unknown_fault_stops_the_start_with_one_line_naming_the_known_ones():
    done = _register("zero_states")
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        f"hitproof-vllm-faults: unknown fault 'zero_states' in {VARIABLE}; known: {', '.join(FAULTS)}"]


def test_every_fault_has_a_launch_profile():
    from tui.core.server.profiles import load_profile, resolve_profile_path

    for fault in FAULTS:
        profile = load_profile(resolve_profile_path(f"vllm-qwen-fault-{fault.replace('_', '-')}"))
        assert profile.env[VARIABLE] == fault
