#!/usr/bin/env bash
# Recall through the state (issue 33, 2026-12-04, call 8): the recurrent layout (every layer a gated delta-net,
# no attention) from scratch, with a curriculum that waits for the copy. Calls 5 and 7 grew the memo on the
# clock and the answer loss never left 1.1; here half the examples are the code sentence, a little filler and
# the question alone ("bare": the copy over a few tokens), the memo length starts at 4 tokens, and it grows only
# while the answer loss (moving mean) is below --grow-below. Two runs side by side on the GPU (lr 3e-3, 1e-3).
#
# It runs in the background across device calls (the machine stays warm 30 s after a call), so the vLLM soaks
# of run.sh share the GPU with it (their servers take 60% of its memory):
#   bash benchmarks/gpu/train_recall_bare.sh start     # carry .whl/transformers-5.24.0-py3-none-any.whl
#   bash benchmarks/gpu/train_recall_bare.sh status    # the last progress lines
#   bash benchmarks/gpu/train_recall_bare.sh fetch     # $OUT/bare.tgz: the folders, logs, result.json
# The tokenizer is the shipped recall model's (tui/embedded/recall_model: the tiny models' tokenizer).
set -u
W=/tmp/m8
case "${1:-status}" in
start)
  if [ -f "$W/started" ]; then echo "train: started before"; exit 0; fi
  mkdir -p "$W" && touch "$W/started"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$W/site" .whl/transformers-*.whl || exit 2
  cp -r tui/embedded/recall_model "$W/tok"
  cp -r tui "$W/src-tui"             # the tree a later call brings may differ: the runs import this copy
  mkdir -p "$W/src" && mv "$W/src-tui" "$W/src/tui"
  MINUTES="${MINUTES:-11}"
  for spec in "a 3e-3 50" "b 1e-3 51"; do
    set -- $spec
    (cd "$W/src" && PYTHONPATH="$W/site:$W/src" PYTHONUNBUFFERED=1 setsid nohup python3 tui/embedded/recall_train.py \
        --tokenizer "$W/tok" --out "$W/$1" --layout recurrent --minutes "$MINUTES" --lr "$2" --seed "$3" \
        --first-weight 4 --start-len 4 --max-len 1800 --bare-share 0.5 --grow-below 0.3 --grow-steps 600 \
        --batch-tokens 65536 --eval-lengths 32,200,800,1500,3000 --eval-n 16 > "$W/$1.log" 2>&1 < /dev/null &)
  done
  sleep 20
  nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv
  tail -n 2 "$W"/a.log "$W"/b.log
  ;;
status)
  for r in a b; do echo "== $r"; grep -E "^train" "$W/$r.log" 2>/dev/null | tail -n 3 | cut -c1-400; done
  ;;
fetch)
  for r in a b; do echo "== $r"; grep -E "^train" "$W/$r.log" 2>/dev/null | tail -n 3 | cut -c1-1200; done
  tar czf "${OUT:-/tmp}/bare.tgz" -C "$W" --exclude site --exclude src --exclude tok .
  ;;
esac
