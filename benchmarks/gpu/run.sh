#!/usr/bin/env bash
# The GPU run of issue 24 (benchmarks/gpu/README.md): python3 of the device image, standard library only.
# bash benchmarks/gpu/run.sh collect | assemble | install | serve bf16|f32 | soak bf16|f32 | stop | status | pack
cd "$(dirname "$0")/../.." || exit 2
export PYTHONUNBUFFERED=1
exec python3 benchmarks/gpu/run.py "$@"
