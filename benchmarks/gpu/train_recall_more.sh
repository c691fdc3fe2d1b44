#!/usr/bin/env bash
# Continue training the hybrid layout from the folder an earlier train_recall.sh run returned, carried in
# .gpu-carry/init/ (with .whl/ and .gpu-carry/tok/ as for train_recall.sh); one process, the whole GPU.
#   call 3 (2026-12-03): MINUTES=4.6 ARGS="--lr 1.5e-3 --hold 0 --ramp 0.3 --start-len 600 --max-len 4000 --seed 34"
#   call 4 (2026-12-03): MINUTES=1.3 ARGS="--lr 1e-3 --hold 1 --start-len 1500 --seed 35 --eval-lengths 800,1500,3000"
#   call 6 (2026-12-04, from call 5's "first"): MINUTES=7.2 ARGS="--first-weight 8 --lr 1e-3 --hold 0 --ramp 0.3
#     --start-len 1200 --max-len 5000 --seed 38 --eval-lengths 1500,3000,4500 --batch-tokens 131072"
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 2
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
mkdir -p /tmp/m
python3 tui/embedded/recall_train.py --tokenizer .gpu-carry/tok --init .gpu-carry/init --out /tmp/m/more \
    --layout hybrid --minutes "${MINUTES:-4.6}" --eval-n 16 ${ARGS:-} > /tmp/m/more.log 2>&1
tar czf "${OUT:-/tmp}/more.tgz" -C /tmp/m more more.log
grep -E "^train(-result)?:" /tmp/m/more.log | tail -4
