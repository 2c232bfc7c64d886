#!/usr/bin/env bash
# The real model (SmolLM2-135M-Instruct) on the device machine: build its HF directory from
# the GGUF parts carried in .carry/ (benchmarks/real_model_carry.sh made them here), run the
# GPU teacher-forcing test, then the bf16 benchmark row, with the model's own stops and with
# --ignore-eos. Results land in $OUT.
set -u
export PYTHONUNBUFFERED=1 KVTIER_GIT_COMMIT=${KVTIER_GIT_COMMIT:-unknown}
DIR=/tmp/smollm2
WORK=.carry/smollm2_sharegpt_1020.json
parts=(.carry/smollm2.gguf.?)
if [ ! -f $DIR/kvtier-real-model.json ]; then
  [ ${#parts[@]} -eq 5 ] || { echo "need 5 GGUF parts, have: ${parts[*]}"; exit 1; }
  python3 -m tests.real_model --gguf "${parts[@]}" --out $DIR 2>&1 | tail -1 || exit 1
fi
export KVTIER_SMOLLM2_DIR=$DIR
python3 -m pytest -q -m gpu tests/engine/test_real_model.py -p no:cacheprovider 2>&1 \
  | tail -15 | tee $OUT/real_model_gpu_tests.txt
timeout 240 python3 -m benchmarks.offline.bench_real_model --model $DIR --workload $WORK \
  --out $OUT/real_model_smollm2_h200.json 2>&1 | tail -1
timeout 240 python3 -m benchmarks.offline.bench_real_model --model $DIR --workload $WORK --ignore-eos \
  --out $OUT/real_model_smollm2_h200_ignore_eos.json 2>&1 | tail -1
