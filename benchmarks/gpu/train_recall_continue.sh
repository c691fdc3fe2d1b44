#!/usr/bin/env bash
# Recall through the state to 99% (issue 33, 2026-12-05, call 10): call 9's run "a" (the recurrent layout,
# slow forgetting rates, 884 steps; held-out recall 75-94% at 1,500-4,500 tokens) continued on memos of the
# lengths the scenarios send, 1,200-5,000 tokens, a fifth of the batches still "bare". Two runs side by side
# (lr 1e-3 and 3e-4), evaluated on 48 memos a cell: 99% needs more than call 9's 16 a cell to be seen.
# The starting folder is carried in .gpu-carry/a (call 9's "a", as it came back: not in git, 5 MiB).
#   bash benchmarks/gpu/train_recall_continue.sh stage   # carry .whl/transformers-5.24.0-py3-none-any.whl, .gpu-carry
#   bash benchmarks/gpu/train_recall_continue.sh start   # once a vLLM server holds its share of the GPU
#   bash benchmarks/gpu/train_recall_continue.sh status
#   bash benchmarks/gpu/train_recall_continue.sh fetch   # waits for both (at most WAIT_S), $OUT/cont.tgz
set -u
W=/tmp/m10
case "${1:-status}" in
stage)
  if [ -f "$W/staged" ]; then echo "train: staged before"; exit 0; fi
  mkdir -p "$W" || exit 2
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$W/site" .whl/transformers-*.whl || exit 2
  cp -r tui/embedded/recall_model "$W/tok" && cp -r .gpu-carry/a "$W/init" || exit 2
  mkdir -p "$W/src" && cp -r tui "$W/src/tui"      # the tree a later call brings may differ: the runs import this copy
  touch "$W/staged"; echo "train: staged"
  ;;
start)
  [ -f "$W/staged" ] || { echo "train: not staged"; exit 2; }
  if [ -f "$W/started" ]; then echo "train: started before"; exit 0; fi
  touch "$W/started"
  MINUTES="${MINUTES:-10}"
  common="--init $W/init --layout recurrent --minutes $MINUTES --first-weight 4 --batch-tokens 65536 --start-len 1200 --max-len 5000 --hold 0 --ramp 0.3 --bare-share 0.2 --eval-lengths 1500,3000,4500 --eval-n 48"
  for spec in "c 1e-3 70" "d 3e-4 71"; do
    set -- $spec
    (cd "$W/src" && PYTHONPATH="$W/site:$W/src" PYTHONUNBUFFERED=1 setsid nohup python3 tui/embedded/recall_train.py \
        --tokenizer "$W/tok" --out "$W/$1" --lr "$2" --seed "$3" $common > "$W/$1.log" 2>&1 < /dev/null &)
  done
  sleep 15
  nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv
  tail -n 2 "$W"/c.log "$W"/d.log
  ;;
status)
  for r in c d; do echo "== $r"; grep -E "^train" "$W/$r.log" 2>/dev/null | tail -n 2 | cut -c1-400; done
  ;;
fetch)
  end=$((SECONDS + ${WAIT_S:-240}))
  while [ $SECONDS -lt $end ] && { [ ! -f "$W/c/result.json" ] || [ ! -f "$W/d/result.json" ]; }; do sleep 5; done
  for r in c d; do echo "== $r"; grep -E "^train" "$W/$r.log" 2>/dev/null | tail -n 3 | cut -c1-1500; done
  tar czf "${OUT:-/tmp}/cont.tgz" -C "$W" --exclude site --exclude src --exclude tok --exclude init .
  ;;
esac
