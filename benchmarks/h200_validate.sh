#!/usr/bin/env bash
# Device run: GPU tests of the runner (graphs, piecewise graphs, eLLM, HCache) and the offline
# ShareGPT throughput with and without piecewise graphs, plus the decode/host-overhead part
# of the GPU-path benchmark. Results in $OUT/results.tar.gz.
set -u
export PYTHONUNBUFFERED=1 KVTIER_GIT_COMMIT=${KVTIER_GIT_COMMIT:-unknown}
R=$OUT/r; mkdir -p $R
timeout 200 python3 -m pytest -q -m gpu tests/runner -p no:cacheprovider -x 2>&1 | tail -25 | tee $R/gpu_tests.txt
for pw in "" "--piecewise-graphs"; do
  tag=${pw:+_piecewise}
  timeout 150 python3 benchmarks/bench_offline_throughput.py $pw \
    --workload .carry/sharegpt_llama31_1000.json --out $R/offline_sharegpt_h200$tag.json 2>&1 \
    | grep -E "tokens_per_s|elapsed|mean_ms|Error|error" | tail -8
done
timeout 150 python3 benchmarks/bench_gpu_path.py --parts host \
  --out $R/gpu_path_h200_host.json 2>&1 | tail -5
tar -C $OUT -czf $OUT/results.tar.gz r && rm -rf $R
