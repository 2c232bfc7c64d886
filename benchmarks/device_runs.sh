#!/usr/bin/env bash
# Device runs, one part per call (each under 10 minutes); files land in $OUT directly.
# Parts a-f ran in session 4, g-m in session 5, n-r in session 6, s-v in session 7 (2026-11-30; their results
# are committed, see the README).
#   bash benchmarks/h200_next.sh a   # GPU tests of what is new, fidelity trace, swap bubble
#   bash benchmarks/h200_next.sh b   # re-profile 13B (issue 6), 13B policies on the H200 (issue 7)
#   bash benchmarks/h200_next.sh c   # async scheduling: GPU tests, offline throughput off/on
#   bash benchmarks/h200_next.sh d   # GPU tests, fidelity trace, 13B policies after the eLLM budget
#   bash benchmarks/h200_next.sh e   # offline at 1024 seats / 16k tokens; eLLM's ridge budget on the GPU
#   bash benchmarks/h200_next.sh f   # the fidelity trace after the allocator warm-up
#   bash benchmarks/h200_next.sh g   # the fidelity trace after gc.freeze(), the
#                                    # async-id guard's GPU tests, async 13B policies
#   bash benchmarks/h200_next.sh h   # eLLM's offloaded prefixes (layer-level overlap) against
#                                    # recompute, with and without overlap (g, h: session 5)
#   bash benchmarks/h200_next.sh i   # the fidelity trace with host issue times, collector
#                                    # pauses and GPU clocks; eLLM's overlap bubble per split
#   bash benchmarks/h200_next.sh j   # after the attention host-path trim: GPU tests, fidelity
#   bash benchmarks/h200_next.sh k   # re-profile 13B on that commit (the fidelity calibration)
#   bash benchmarks/h200_next.sh l   # the fidelity trace with the allocator's counters per
#                                    # step, then again with expandable segments
#   bash benchmarks/h200_next.sh m   # on one machine: the 13B calibration (its loop now
#                                    # fitted to its serving trace's gaps), then the trace
#   bash benchmarks/h200_next.sh n   # GPU tests after the coalesced block copies;
#                                    # eLLM's bubble again; swap's overlap again
#   bash benchmarks/h200_next.sh o   # the 13B policies over a longer window
#                                    # (3,000 prompts, 150 s) for issue 7's "few minutes"
#   bash benchmarks/h200_next.sh p   # offline throughput after the host trim,
#                                    # with decode graphs up to 512 (vLLM's cap) and up to 1024
#   bash benchmarks/h200_next.sh q   # where a 1024-seat decode step's time goes (profiler)
#   bash benchmarks/h200_next.sh r   # part o with eLLM dropping prefixes (ridge budget,
#                                    # offloaded groups with overlap)
#   bash benchmarks/h200_next.sh s   # (session 7) part o's window for swap and hcache, so all
#                                    # four policies have run over minutes (issue 7)
#   bash benchmarks/h200_next.sh t   # (session 7) after greedy argmax on bf16 logits: GPU
#                                    # tests, offline at 1024 seats, a profile of its decode steps
#   bash benchmarks/h200_next.sh u   # (session 7) decode attention tile / stage / warp variants
#                                    # at the offline run's short contexts (issue 3)
#   bash benchmarks/h200_next.sh v   # (session 7) cuBLAS on the decode GEMMs by token count,
#                                    # padded / transposed / cuBLASLt beside the plain call
#   bash benchmarks/h200_next.sh w   # not run: session 8 measured the host overhead by part
#                                    # instead (bench_gpu_path.py's phases_ms; README), on two
#                                    # machines, with its own calls (each result names its command)
set -u
export PYTHONUNBUFFERED=1 KVTIER_GIT_COMMIT=${KVTIER_GIT_COMMIT:-unknown}
R=$OUT
W8=.carry/sharegpt_llama31_1000.json

fidelity_real() {  # the 600-request 13B fidelity trace (real half) [flags...]
  timeout 130 python3 benchmarks/fidelity_report.py real \
    --workload .carry/sharegpt_llama2-13b_1000.json --model llama-2-13b --num-requests 600 \
    --rate 15 "$@" --out $R/fidelity_real_h200.json 2>&1 | tail -2
}

bench_13b() {  # NAME TIMEOUT POLICIES [flags...]: the 13B paper-load comparison, tarred
  local name=$1 limit=$2 policies=$3
  shift 3
  timeout $limit python3 -m kvtier.cli bench --model llama-2-13b --load-format dummy \
    --policies $policies --workload prepared \
    --dataset-path .carry/sharegpt_llama2_13b_1500.json --num-prompts 600 \
    --arrivals paper-gamma --slo-ttft 2000 --slo-tpot 100 --kv-cache-gb 20 --swap-space 24 \
    --max-model-len 2048 --max-num-seqs 128 --max-duration 40 --gpu-monitor "$@" \
    --out $R/$name 2>&1 | tail -8
  tar -C $R -czf $R/$name.tar.gz $name && rm -rf $R/$name  # $OUT returns <= 8 files
}

offline() {  # OUT [flags...]: offline ShareGPT throughput, llama-3.1-8b
  local out=$1
  shift
  timeout 120 python3 benchmarks/bench_offline_throughput.py --workload $W8 "$@" \
    --out $R/$out 2>&1 | grep -E '"output_tokens_per_s|"mean_ms' | tail -4
}

case "${1:-a}" in
a)
  timeout 150 python3 -m pytest -q -m gpu tests/runner tests/kernels/test_kernel_silu_and_mul.py \
    -p no:cacheprovider 2>&1 | tail -8 > $R/gpu_tests.txt; cat $R/gpu_tests.txt
  fidelity_real
  timeout 120 python3 benchmarks/bench_swap_overlap.py --quick --out $R/swap_overlap_h200.json \
    2>&1 | tail -4
  ;;
b)
  timeout 300 python3 -m kvtier.costmodel.calibrate llama-2-13b \
    --out $R/calib_h200_llama-2-13b.json 2>&1 | tail -5
  bench_13b bench_13b 250 recompute,swap,hcache,ellm
  ;;
c)  # async scheduling: GPU exactness, then offline throughput without and with it
  timeout 150 python3 -m pytest -q -m gpu tests/runner/test_gpu_path.py -k "async" \
    -p no:cacheprovider 2>&1 | tail -8 > $R/gpu_tests_async.txt; cat $R/gpu_tests_async.txt
  offline offline_sharegpt_h200_sync.json --no-async-scheduling
  offline offline_sharegpt_h200.json --async-scheduling
  offline offline_sharegpt_h200_async_1024.json --async-scheduling --max-num-seqs 1024
  ;;
d)  # after the eLLM step budget, the HCache store rewrite and the warm-up steps
  timeout 120 python3 -m pytest -q -m gpu tests/runner -p no:cacheprovider 2>&1 | tail -8 \
    > $R/gpu_tests_d.txt; cat $R/gpu_tests_d.txt
  fidelity_real
  bench_13b bench_13b 260 recompute,swap,hcache,ellm \
    --ellm-calibration benchmarks/results/calib_h200_llama-2-13b.json
  ;;
e)  # offline throughput with a larger token budget; eLLM's roofline budget measured
  offline offline_sharegpt_h200_async_1024_16k.json --max-num-seqs 1024 \
    --max-num-batched-tokens 16384
  bench_13b bench_13b_ridge 200 recompute,ellm --ellm-recompute-budget ridge
  ;;
f)  # the fidelity trace after the allocator warm-up step
  timeout 60 python3 -m pytest -q -m gpu tests/runner/test_gpu_path.py -k "greedy_equals or async" \
    -p no:cacheprovider 2>&1 | tail -4 > $R/gpu_tests_f.txt; cat $R/gpu_tests_f.txt
  fidelity_real
  ;;
g)  # after gc.freeze() (is it the mixed steps' scattered +6-10 ms outliers?)
  timeout 120 python3 -m pytest -q -m gpu tests/runner -p no:cacheprovider 2>&1 | tail -4 \
    > $R/gpu_tests_g.txt; cat $R/gpu_tests_g.txt
  fidelity_real
  bench_13b bench_13b_async 260 recompute,swap,hcache,ellm --async-scheduling \
    --ellm-calibration benchmarks/results/calib_h200_llama-2-13b.json
  ;;
h)  # eLLM with offloaded prefixes (--ellm-host-groups auto priced by the
    # calibration: 9 of 10 groups copied in, 1 recomputed) vs recompute, the ridge budget;
    # then without the overlap
  for ov in overlap-swap no-overlap-swap; do
    bench_13b bench_13b_host_$ov 200 recompute,ellm --ellm-recompute-budget ridge \
      --ellm-host-groups auto --$ov \
      --ellm-calibration benchmarks/results/calib_h200_llama-2-13b.json
  done
  ;;
i)  # why the early mixed steps run slow (host issue time per step, gc pauses, SM clocks);
    # the bubble eLLM's copies leave at each host-group split
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu \
    --format=csv -lms 250 > $R/smi_fidelity.csv 2>&1 &
  local_smi=$!
  fidelity_real
  kill $local_smi
  timeout 300 python3 benchmarks/bench_ellm_overlap.py \
    --calibration benchmarks/results/calib_h200_llama-2-13b.json \
    --out $R/ellm_overlap_h200.json 2>&1 | tail -22
  ;;
j)  # the mixed steps' host issue time after deriving attention's per-step views once
  timeout 150 python3 -m pytest -q -m gpu tests/runner -p no:cacheprovider 2>&1 | tail -4 \
    > $R/gpu_tests_j.txt; cat $R/gpu_tests_j.txt
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu \
    --format=csv -lms 250 > $R/smi_fidelity.csv 2>&1 &
  local_smi=$!
  fidelity_real
  kill $local_smi
  ;;
l)  # do the slow early mixed steps coincide with the caching allocator growing?
  fidelity_real --allocator-probe
  mv $R/fidelity_real_h200.json $R/fidelity_real_h200_alloc.json
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True fidelity_real --allocator-probe
  mv $R/fidelity_real_h200.json $R/fidelity_real_h200_expandable.json
  ;;
m)  # calibration and fidelity trace from one lease: the host's speed is the machine's
  timeout 200 python3 -m kvtier.costmodel.calibrate llama-2-13b \
    --out $R/calib_h200_llama-2-13b.json 2>&1 | grep -E "loop|wrote" | tail -4
  fidelity_real
  ;;
n)  # after copy_blocks: exactness of swaps and offloaded prefixes, then the two bubbles
  timeout 150 python3 -m pytest -q -m gpu tests/runner -p no:cacheprovider 2>&1 | tail -4 \
    > $R/gpu_tests_n.txt; cat $R/gpu_tests_n.txt
  timeout 300 python3 benchmarks/bench_ellm_overlap.py \
    --calibration benchmarks/results/calib_h200_llama-2-13b.json \
    --out $R/ellm_overlap_h200.json 2>&1 | tail -17
  timeout 120 python3 benchmarks/bench_swap_overlap.py --quick --out $R/swap_overlap_h200.json \
    2>&1 | tail -3
  ;;
o)  # issue 7's real-H200 comparison over minutes rather than 40 s (one policy pair a call)
  timeout 560 python3 -m kvtier.cli bench --model llama-2-13b --load-format dummy \
    --policies recompute,ellm --workload prepared \
    --dataset-path .carry/sharegpt_llama2_13b_3000.json --num-prompts 3000 \
    --arrivals paper-gamma --slo-ttft 2000 --slo-tpot 100 --kv-cache-gb 20 --swap-space 24 \
    --max-model-len 2048 --max-num-seqs 128 --max-duration 150 --gpu-monitor \
    --async-scheduling --ellm-calibration benchmarks/results/calib_h200_llama-2-13b.json \
    --out $R/bench_13b_long 2>&1 | tail -6
  tar -C $R -czf $R/bench_13b_long.tar.gz bench_13b_long && rm -rf $R/bench_13b_long
  ;;
t)  # greedy sampling straight from bf16 logits (no fp32 copy): exactness, then its effect
  timeout 200 python3 -m pytest -q -m gpu tests/runner -p no:cacheprovider 2>&1 | tail -3 \
    > $R/gpu_tests_t.txt; cat $R/gpu_tests_t.txt
  offline offline_sharegpt_h200_async_1024_16k_bf16_logits.json --max-num-seqs 1024 \
    --max-num-batched-tokens 16384 --max-graph-batch-size 1024
  timeout 150 python3 benchmarks/profile_offline_steps.py --workload $W8 --skip 12 --steps 6 \
    --max-num-seqs 1024 --max-num-batched-tokens 16384 --max-graph-batch-size 1024 \
    --out $R/profile_offline_decode_h200_bf16_logits.json 2>&1 | tail -2
  ;;
u)  # which decode tile config suits the offline run's short contexts, targets kept
  timeout 560 python3 benchmarks/bench_kernels.py --parts short_context \
    --commit "$KVTIER_GIT_COMMIT" --out $R/kernels_short_context_h200.json 2>&1 | tail -12
  ;;
v)  # where cuBLAS falls short of the GEMM floors near the ridge, and what a call change buys
  timeout 400 python3 benchmarks/bench_gemm_shapes.py --out $R/gemm_shapes_h200.json 2>&1 \
    | tail -16
  ;;
s)  # part o's long window for the other two policies (one pair a call: ~6 min)
  timeout 560 python3 -m kvtier.cli bench --model llama-2-13b --load-format dummy \
    --policies swap,hcache --workload prepared \
    --dataset-path .carry/sharegpt_llama2_13b_3000.json --num-prompts 3000 \
    --arrivals paper-gamma --slo-ttft 2000 --slo-tpot 100 --kv-cache-gb 20 --swap-space 24 \
    --max-model-len 2048 --max-num-seqs 128 --max-duration 150 --gpu-monitor \
    --async-scheduling --out $R/bench_13b_long_swap_hcache 2>&1 | tail -6
  tar -C $R -czf $R/bench_13b_long_swap_hcache.tar.gz bench_13b_long_swap_hcache \
    && rm -rf $R/bench_13b_long_swap_hcache
  ;;
r)  # part o, eLLM at the ridge budget with offloaded prefix groups copied in beside compute
  timeout 560 python3 -m kvtier.cli bench --model llama-2-13b --load-format dummy \
    --policies recompute,ellm --workload prepared \
    --dataset-path .carry/sharegpt_llama2_13b_3000.json --num-prompts 3000 \
    --arrivals paper-gamma --slo-ttft 2000 --slo-tpot 100 --kv-cache-gb 20 --swap-space 24 \
    --max-model-len 2048 --max-num-seqs 128 --max-duration 150 --gpu-monitor \
    --async-scheduling --ellm-recompute-budget ridge --ellm-host-groups auto --overlap-swap \
    --ellm-calibration benchmarks/results/calib_h200_llama-2-13b.json \
    --out $R/bench_13b_long_ridge 2>&1 | tail -6
  tar -C $R -czf $R/bench_13b_long_ridge.tar.gz bench_13b_long_ridge && rm -rf $R/bench_13b_long_ridge
  ;;
p)  # offline ShareGPT at 1024 seats / 16k tokens: decode graphs to 512, then to 1024
  offline offline_sharegpt_h200_async_1024_16k_host_trim.json --max-num-seqs 1024 \
    --max-num-batched-tokens 16384
  offline offline_sharegpt_h200_async_1024_16k_graphs1024.json --max-num-seqs 1024 \
    --max-num-batched-tokens 16384 --max-graph-batch-size 1024
  ;;
q)  # kernels of decode steps at ~1000, ~700 and ~300 requests (1024 seats, graphs to 1024)
  for skip in 12 200 500; do
    timeout 150 python3 benchmarks/profile_offline_steps.py --workload $W8 --skip $skip \
      --steps 6 --max-num-seqs 1024 --max-num-batched-tokens 16384 --max-graph-batch-size 1024 \
      --out $R/profile_offline_decode_h200_skip$skip.json 2>&1 | tail -3
  done
  ;;
w)  # session 7 measured the host overhead at 0.98-2.80 ms on one machine (0.91 before): where
  # does a synchronous step's host time go there, and how much does it vary?
  timeout 120 python3 benchmarks/bench_gpu_path.py --parts decode_targets,host \
    --out $R/gpu_path_h200_targets_w.json 2>&1 | grep -o "host_overhead_ms': [0-9.]*"
  for i in 2 3; do
    timeout 60 python3 benchmarks/bench_gpu_path.py --parts host --out $R/host_w$i.json 2>&1 \
      | grep -o "host_overhead_ms': [0-9.]*"
  done
  timeout 150 python3 benchmarks/profile_offline_steps.py --workload $W8 --skip 40 --steps 40 \
    --max-num-seqs 256 --cprofile \
    --out $R/cprofile_decode_256_h200.json 2>&1 | tail -2
  ;;
k)
  timeout 330 python3 -m kvtier.costmodel.calibrate llama-2-13b \
    --out $R/calib_h200_llama-2-13b.json 2>&1 | tail -5
  ;;
esac
