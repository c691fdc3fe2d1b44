#!/usr/bin/env bash
# Two hitproof trees against one vLLM, alternating (issue 34: a 5% change in hitproof's CPU a request is smaller
# than the spread between sessions, so both are measured in one session, on one server, one pair after the other).
#
#   bash benchmarks/gpu/pairs.sh BUDGET_S [BASE_TGZ]
#
# On the GPU machine, after `run.sh ... serve recall` (the server at 127.0.0.1:8321): rate.py at
# $HPGPU_STREAMS (128) streams, gpu-quick --power 0.3%, this tree ("new") then the tree in BASE_TGZ ("base",
# `git archive COMMIT tui scenarios benchmarks/gpu/rate.py benchmarks/evidence_rate.py pyproject.toml`, unpacked
# to /tmp/base; none: new only), again and again, until a soak would no longer end within BUDGET_S seconds of the
# start (a pair took about 75 s in runs U and V). One line a soak on stdout and in $OUT/pairs.txt (or
# /tmp/hpgpu/results/pairs.txt): tag, verdict, requests, checked hits, steady CPU ms a request of hitproof and of
# the raw client, their ratio, the request-rate ratio, the TTFT hitproof adds (median / p99 ms), the seconds to
# 299 checked hits, the three phases where hitproof took the most longer than the replay (rate.py's "phases",
# phase_time.line); the first soak is preceded by one not measured (rate.py --warm-up; HPGPU_WARMUP=0: none, for a
# server already warm from an earlier call: the first soak after vLLM's start ran slower on the server's side in
# runs W and Z); a soak that did not pass adds its verdict's reasons, and its log comes back gzipped in $OUT
# (the first $HPGPU_KEEP_LOGS, 2: run Y's two INCONCLUSIVE soaks at 128 streams came back without a reason). Each
# pair's result.json stays in /tmp/hpgpu/results/pairs/.
set -uo pipefail
budget=${1:?budget in seconds}
base_tgz=${2:-}
streams=${HPGPU_STREAMS:-128}
url=${HPGPU_URL:-http://127.0.0.1:8321}
site=/tmp/hpgpu/site
here=$(pwd)
dir=/tmp/hpgpu/results/pairs
out=${OUT:-/tmp/hpgpu/results}/pairs.txt
mkdir -p "$dir"
start=$(date +%s)
if [ -n "$base_tgz" ]; then
    rm -rf /tmp/base && mkdir -p /tmp/base && tar -xzf "$base_tgz" -C /tmp/base || exit 2
fi
summary() {   # tag result.json: one line; exit status 3 for a soak that did not pass (or left no result)
    python3 - "$1" "$2" "$here/benchmarks/gpu" <<'PY'
import json, sys
sys.path.insert(0, sys.argv[3])
import phase_time                     # this tree's (the base tree's results may have no "phases")
tag, path = sys.argv[1], sys.argv[2]
try:
    r = json.load(open(path))
except (OSError, ValueError) as exc:
    print(f"{tag}: no result ({exc})"); sys.exit(3)
h, w, t = r.get("hitproof") or {}, r.get("raw") or {}, r.get("ttft") or {}
passed = r.get("verdict") == "pass"
ms = lambda v: "?" if v is None else f"{1000 * v:.3f}"
num = lambda v, f: "?" if v is None else format(v, f)
print(f"{tag}: verdict {r.get('verdict')}, {h.get('requests')} requests, {h.get('checked_hits')} checked, CPU "
      f"{ms(h.get('steady_cpu_s_per_request'))} / {ms(w.get('steady_cpu_s_per_request'))} ms, ratio "
      f"{num(r.get('steady_cpu_ratio'), '.2f')}, rate ratio {num(r.get('rate_ratio'), '.3f')}, TTFT added "
      f"{num(t.get('added_median_ms'), '.1f')} / {num(t.get('added_p99_ms'), '.1f')} ms, "
      f"{num(r.get('seconds_to_default_target'), '.1f')} s to 299 checked"
      + (f"; added: {phase_time.line(r['phases'])}" if r.get("phases") else "")
      + ("" if passed else f" (why: {r.get('verdict_reasons') or r.get('verdict_message') or 'not said'})"))
sys.exit(0 if passed else 3)
PY
}
kept_logs=0
keep_log() {   # tag soak-folder: a soak that did not pass, its log gzipped where the call's files come back
    if [ -n "${OUT:-}" ] && [ -f "$2/H.jsonl" ] && [ "$kept_logs" -lt "${HPGPU_KEEP_LOGS:-2}" ]; then
        gzip -c "$2/H.jsonl" > "$OUT/$1-$streams-H.jsonl.gz" && kept_logs=$((kept_logs + 1))
    fi
}
one() {   # tag tree
    local tag=$1 tree=$2 left=$(( budget - ($(date +%s) - start) ))
    if [ "$left" -lt 90 ]; then return 1; fi
    local warm=()
    if [ "${HPGPU_WARMUP:-1}" != 0 ] && [ "$tag" = new1 ]; then warm=(--warm-up); fi
    (cd "$tree" && PYTHONPATH="$site:$tree" timeout $(( left - 5 )) python3 benchmarks/gpu/rate.py --attach "$url" \
        --scenario scenarios/gpu-quick.toml --streams "$streams" --power 0.3% "${warm[@]}" --out "$dir/$tag" \
        > "$dir/$tag.log" 2>&1)
    if [ ${#warm[@]} -gt 0 ]; then grep -h "warm-up: exit" "$dir/$tag.log" | tee -a "$out"; fi
    if ! summary "$tag" "$dir/$tag/streams-$streams/result.json" | tee -a "$out"; then
        keep_log "$tag" "$dir/$tag/streams-$streams"
    fi
}
i=0
while true; do
    i=$((i + 1))
    one "new$i" "$here" || break
    if [ -n "$base_tgz" ]; then one "base$i" /tmp/base || break; fi
done
echo "pairs: $(( $(date +%s) - start )) s"
