#!/usr/bin/env bash
# Train the recall hybrids on the GPU machine (issue 33): one process per layer layout, side by side on one
# GPU (a 2.6 M-parameter model leaves it mostly idle). Run from the repository root there, with
#   .whl/transformers-5.24.0-py3-none-any.whl   (the version tui/embedded/tiny.py builds with here)
#   .gpu-carry/tok/                              (the tiny models' tokenizer, ~/.cache/hitproof/tiny/tokenizer)
# carried. Each layout comes back as $OUT/LAYOUT.tgz: the Hugging Face folder, train.log, result.json.
set -u
MINUTES=${MINUTES:-7.5}
LAYOUTS=${LAYOUTS:-"hybrid late"}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 2
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
nvidia-smi -L
mkdir -p /tmp/m
for layout in $LAYOUTS; do
  (python3 tui/embedded/recall_train.py --tokenizer .gpu-carry/tok --out /tmp/m/$layout --layout $layout \
      --seed 33 --minutes "$MINUTES" --max-len 4000 > /tmp/m/$layout.log 2>&1
   cp /tmp/m/$layout.log /tmp/m/$layout/console.log 2>/dev/null
   tar czf "${OUT:-/tmp}/$layout.tgz" -C /tmp/m "$layout" "$layout.log") &
done
wait
for layout in $LAYOUTS; do echo "== $layout"; grep -E "^train(-result)?:" /tmp/m/$layout.log | tail -4; done
