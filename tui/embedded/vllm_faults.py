"""The in-engine fault plugin (vllm_fault_plugin.py) as the distribution vLLM discovers: built and installed.

vLLM loads the `vllm.general_plugins` entry points of its environment in every process. The plugin is
packed here into a pure-Python wheel (`hitproof_vllm_faults`, its version a hash of the source, so an
edited plugin is installed again) and pip-installed into the embedded vLLM's venv by `hitproof setup
--engine vllm`, or, for another vLLM (the GPU run), written to a folder with `wheel(folder)` and installed
there with `pip install --target`. It does nothing unless HITPROOF_VLLM_FAULT names one of FAULTS.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

from .vllm_fault_plugin import FAULTS, VARIABLE

__all__ = ["FAULTS", "VARIABLE", "DISTRIBUTION", "version", "wheel"]

SOURCE = Path(__file__).with_name("vllm_fault_plugin.py")
DISTRIBUTION = "hitproof_vllm_faults"
ENTRY_POINTS = "[vllm.general_plugins]\nhitproof_faults = hitproof_vllm_faults:register\n"


def version() -> str:
    """1.0.0+<the source's first 12 hex digits>: a changed plugin is a new version."""
    return "1.0.0+" + hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def wheel(folder: Path) -> Path:
    """Write the plugin's wheel into `folder`; its path. The same bytes for the same source (zip dates fixed)."""
    v = version()
    info = f"{DISTRIBUTION}-{v}.dist-info"
    files = {
        f"{DISTRIBUTION}.py": SOURCE.read_bytes(),
        f"{info}/METADATA": (f"Metadata-Version: 2.1\nName: hitproof-vllm-faults\nVersion: {v}\n"
                             "Summary: hitproof's in-engine faults for vLLM's hybrid prefix cache (off unless "
                             f"{VARIABLE} names one)\n").encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: hitproof\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/entry_points.txt": ENTRY_POINTS.encode(),
    }
    record = [_record_line(name, data) for name, data in files.items()] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{DISTRIBUTION}-{v}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), data)
    return path
