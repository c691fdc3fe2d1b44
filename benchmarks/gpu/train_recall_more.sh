#!/usr/bin/env bash
# Continue training the hybrid layout from the folder an earlier train_recall.sh run returned, carried in
# .gpu-carry/init/ (with .whl/ and .gpu-carry/tok/ as for train_recall.sh); one process, the whole GPU.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 2
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
mkdir -p /tmp/m
python3 tui/embedded/recall_train.py --tokenizer .gpu-carry/tok --init .gpu-carry/init --out /tmp/m/hybrid2 \
    --layout hybrid --seed 34 --minutes "${MINUTES:-4.6}" --lr 1.5e-3 --hold 0 --ramp 0.3 --start-len 600 \
    --max-len 4000 --eval-n 48 > /tmp/m/hybrid2.log 2>&1
tar czf "${OUT:-/tmp}/hybrid2.tgz" -C /tmp/m hybrid2 hybrid2.log
grep -E "^train(-result)?:" /tmp/m/hybrid2.log | tail -5
