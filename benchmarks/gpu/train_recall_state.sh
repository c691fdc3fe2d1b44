#!/usr/bin/env bash
# Recall that needs the state (issue 33, call 7, 2026-12-04): two trainings at once on the one GPU, each its own
# process, both on memos that start short (the copy is learned there) and grow to 1,800 tokens:
#  - "window": the hybrid from tui/embedded/recall_model (call 6's model, whose copy is attention's: with
#    attention windowed to 24 positions it recalls 0%) trained with its attention layers windowed to 24
#    positions (--attention-window), so that the code can cross the memo only in the recurrent state;
#  - "recurrent": the recurrent layout (no attention) from scratch, from 32-token memos (call 5's started at 200).
# Needs .whl/ (transformers 5.24.0) and .gpu-carry/tok/ carried, as train_recall.sh does. Results: $OUT/state.tgz.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 2
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
mkdir -p /tmp/m
MINUTES="${MINUTES:-6}"
python3 tui/embedded/recall_train.py --tokenizer .gpu-carry/tok --init tui/embedded/recall_model \
    --out /tmp/m/window --layout hybrid --minutes "$MINUTES" --attention-window 24 --first-weight 4 \
    --lr 2e-3 --hold 0.1 --ramp 0.8 --start-len 48 --max-len 1800 --batch-tokens 65536 --seed 40 \
    --eval-lengths 1500,3000 --eval-n 16 > /tmp/m/window.log 2>&1 &
python3 tui/embedded/recall_train.py --tokenizer .gpu-carry/tok --out /tmp/m/recurrent --layout recurrent \
    --minutes "$MINUTES" --first-weight 4 --lr 3e-3 --hold 0.15 --ramp 0.85 --start-len 32 --max-len 1800 \
    --batch-tokens 65536 --seed 41 --eval-lengths 1500,3000 --eval-n 16 > /tmp/m/recurrent.log 2>&1 &
wait
tar czf "${OUT:-/tmp}/state.tgz" -C /tmp/m .
for f in window recurrent; do echo "== $f"; grep -E "^train" /tmp/m/$f.log | tail -5 | cut -c1-700; done
