"""`hitproof setup --test-deps`: the system packages the test suite uses and pip cannot install:
Debian's nginx (a real gateway in front of the server, tests/soak/test_gateway.py) and chromium
(headless, renders the HTML report, tests/report/test_html_report.py). Installed with apt-get, as
root or through sudo; what is already on the PATH is left alone."""

from __future__ import annotations

import os
import shutil
import subprocess

from ..core.config.errors import HitproofError

# the command the suite looks for -> the Debian package that provides it
PACKAGES = {"nginx": "nginx", "chromium": "chromium"}


def missing() -> list[str]:
    return [package for command, package in PACKAGES.items() if shutil.which(command) is None]


def _apt(prefix: list[str], args: list[str], progress) -> None:
    command = [*prefix, "apt-get", *args]
    progress(" ".join(command))
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        tail = " | ".join(line for line in done.stdout.strip().splitlines()[-3:])
        raise HitproofError(f"{' '.join(command)} failed (exit {done.returncode}): {tail}")


def install(progress) -> list[str]:
    """Install what is missing; returns the packages installed (empty: all were there)."""
    needed = missing()
    if not needed:
        progress(f"already installed: {', '.join(PACKAGES)}")
        return []
    if shutil.which("apt-get") is None:
        raise HitproofError(f"the test suite needs {' and '.join(needed)}, and this system has no apt-get: "
                            f"install them with its package manager")
    prefix: list[str] = []
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        if shutil.which("sudo") is None:
            raise HitproofError(f"installing {' and '.join(needed)} needs root: run as root, or install sudo")
        prefix = ["sudo"]
    _apt(prefix, ["update", "-qq"], progress)
    _apt(prefix, ["install", "-y", "-qq", *needed], progress)
    still = missing()
    if still:
        raise HitproofError(f"apt-get installed {' '.join(needed)}, but {' and '.join(still)} is not on the PATH")
    progress(f"installed: {', '.join(needed)}")
    return needed
