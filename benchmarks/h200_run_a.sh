#!/usr/bin/env bash
# Final device run of the session (issues 3, 6, 7): GPU tests, offline ShareGPT throughput
# (piecewise graphs on, the default), the two decode targets and host overhead, bf16
# agreement of the KV policies, and the fidelity trace (real half). Files land in $OUT
# directly (no tar: a run cut short still returns what it wrote).
set -u
export PYTHONUNBUFFERED=1 KVTIER_GIT_COMMIT=${KVTIER_GIT_COMMIT:-unknown}
R=$OUT
timeout 30 python3 -m pytest -q -m gpu tests/kernels/test_kernel_silu_and_mul.py \
  -p no:cacheprovider 2>&1 | tail -3 > $R/gpu_tests_silu.txt; cat $R/gpu_tests_silu.txt
timeout 110 python3 benchmarks/bench_offline_throughput.py \
  --workload .carry/sharegpt_llama31_1000.json --out $R/offline_sharegpt_h200.json 2>&1 \
  | grep -E "tokens_per_s|elapsed|mean_ms|Error|error" | tail -8
timeout 90 python3 benchmarks/bench_gpu_path.py --parts decode_targets,host \
  --out $R/gpu_path_h200_targets.json 2>&1 | grep -E "fraction_of_roofline|host_overhead|Error" \
  | cut -c1-400 | tail -4
timeout 70 python3 -m pytest -q -m gpu tests/runner -p no:cacheprovider 2>&1 | tail -6 \
  > $R/gpu_tests_runner.txt; cat $R/gpu_tests_runner.txt
timeout 90 python3 benchmarks/bench_bf16_agreement.py --out $R/bf16_agreement_h200.json 2>&1 \
  | grep -E "^(float32|bfloat16)" | cut -c1-200
timeout 130 python3 benchmarks/fidelity_report.py real --workload .carry/sharegpt_llama2-13b_1000.json \
  --model llama-2-13b --num-requests 600 --rate 15 --out $R/fidelity_real_h200.json 2>&1 | tail -3
