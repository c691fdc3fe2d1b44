#!/usr/bin/env bash
# Two trainings at once on the one GPU (issue 33, call 5, written 2026-12-03, run 2026-12-04), each its own process:
#  - "first": the hybrid from tui/embedded/recall_model (call 4's model, which copies the code's last 11
#    digits and gets the first wrong) with the first digit's loss weighed up (--first-weight), memos of
#    1,000-5,000 tokens, judged at 1,500, 3,000 and 4,500 (the scenarios' lengths and the field report's);
#  - "recurrent": the recurrent layout (no attention layer: the code can only cross the memo in the state)
#    from scratch with the answer and text losses normalised apart, which call 1's recurrent run lacked.
# Needs .whl/ (transformers 5.24.0) and .gpu-carry/tok/ (the tiny models' tokenizer) carried, as
# train_recall.sh does. Results: $OUT/pair.tgz (both folders and logs).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 2
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
mkdir -p /tmp/m
python3 tui/embedded/recall_train.py --tokenizer .gpu-carry/tok --init tui/embedded/recall_model \
    --out /tmp/m/first --layout hybrid --minutes "${FIRST_MINUTES:-6}" --first-weight "${FIRST_WEIGHT:-8}" \
    --lr 1.5e-3 --hold 0 --ramp 0.4 --start-len 1000 --max-len 5000 --batch-tokens 65536 --seed 36 \
    --eval-lengths 1500,3000,4500 --eval-n 48 > /tmp/m/first.log 2>&1 &
python3 tui/embedded/recall_train.py --tokenizer .gpu-carry/tok --out /tmp/m/recurrent --layout recurrent \
    --minutes "${RECURRENT_MINUTES:-6.5}" --lr 3e-3 --hold 0.15 --ramp 0.8 --start-len 200 --max-len 3000 \
    --batch-tokens 65536 --seed 37 --eval-lengths 800,1500,3000 --eval-n 32 > /tmp/m/recurrent.log 2>&1 &
wait
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
tar czf "${OUT:-/tmp}/pair.tgz" -C /tmp/m .
for f in first recurrent; do echo "== $f"; grep -E "^train" /tmp/m/$f.log | tail -4 | cut -c1-600; done
