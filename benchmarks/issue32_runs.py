"""Issue 32's real runs: one server, clean soaks and soaks through the corrupting proxy's `early_change`.

    python benchmarks/issue32_runs.py --engine vllm --model gemma3-270m --scenario quick \
        --modes none,early_change --out logs/issue32
    python benchmarks/issue32_runs.py --engine vllm --model qwen3next-tiny --scenario hybrid-quick \
        --extra-args=--mamba-ssm-cache-dtype,bfloat16 --modes none,early_change --out logs/issue32

Each soak is `python -m tui run --attach URL --scenario S --headless --record LOG` (through the proxy when
the mode is not `none`); the server is started once (tui.embedded.launch_spec + ServerProcess) and always
stopped. Prints each soak's exit code, verdict, the calibrated resume cost (the `resume`
event) and the power line's greedy-comparison count; writes DIR/summary-LABEL.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from support.corrupting_proxy import CorruptingProxy  # noqa: E402
from tui.core.server.launch import ServerProcess, free_port  # noqa: E402
from tui.embedded import launch_spec, prepare  # noqa: E402


def summarize(log: Path) -> dict:
    events = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    end = next((e for e in events if e["type"] == "run_end"), {})
    findings = [e for e in events if e["type"] == "finding"]
    calibrated = next((e["calibration"] for e in events if e["type"] == "resume"), None)
    compared = [e for e in events if e["type"] == "fingerprint" and e.get("text_same") is not None]
    fails = sorted({(f["kind"], f["phase"], (f.get("evidence") or {}).get("twin_verdict")) for f in findings
                    if f["severity"] == "fail"}, key=str)
    return {"verdict": end.get("verdict"), "exit_code": end.get("exit_code"), "message": end.get("message"),
            "resume": calibrated, "whole_text_compared": len(compared),
            "whole_text_differ": sum(not e["text_same"] for e in compared),
            "fails": [list(f) for f in fails],
            "warns": sorted({f["kind"] for f in findings if f["severity"] == "warn"}),
            "requests": sum(e["type"] == "request_end" for e in events)}


async def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--engine", default="vllm")
    p.add_argument("--model", default="gemma3-270m")
    p.add_argument("--scenario", default="quick")
    p.add_argument("--modes", default="none,early_change")
    p.add_argument("--extra-args", default="")
    p.add_argument("--label", default="")
    p.add_argument("--out", default="logs/issue32")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    extra = tuple(x for x in a.extra_args.split(",") if x)
    prepare(a.engine, model=a.model, progress=lambda line: print(f"[setup] {line}", flush=True))
    spec = launch_spec(a.engine, port=free_port(), model=a.model, extra_args=extra)
    server = ServerProcess(list(spec.argv), url=spec.url, env=spec.env)
    label = a.label or f"{a.engine}-{a.model}"
    results = {}
    await server.start()
    try:
        await server.wait_ready(spec.startup_timeout)
        for i, mode in enumerate(a.modes.split(",")):
            proxy = await CorruptingProxy(spec.url, mode).start() if mode != "none" else None
            log = out / f"{label}-{a.scenario}-{mode}-{i}.jsonl"
            started = time.monotonic()
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tui", "run", "--attach", proxy.url if proxy else spec.url,
                "--scenario", a.scenario, "--headless", "--record", str(log), cwd=str(ROOT),
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
            text, _ = await proc.communicate()
            if proxy is not None:
                await proxy.close()
            (out / f"{label}-{a.scenario}-{mode}-{i}.out").write_bytes(text)
            s = summarize(log)
            s.update(exit=proc.returncode, seconds=round(time.monotonic() - started),
                     corrupted=proxy.corrupted if proxy else 0)
            results[f"{mode}-{i}"] = s
            print(json.dumps({f"{mode}-{i}": s}, indent=1), flush=True)
    finally:
        await server.stop()
    (out / f"summary-{label}-{a.scenario}.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
