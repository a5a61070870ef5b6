#!/usr/bin/env bash
# The GPU figures bench/RESULTS.md still waits for, as device commands that each fit 600 s.
#   bash bench/gpu_batch.sh cov    # bytecode written, the runtime step's pieces and whole-job table on this host
#                                  # (NO_STEP_BENCH=1: left out); then the hook share, 17 cases in four groups
#                                  # side by side, each case a full compile in its own process, cold store, then
#                                  # warm (COV_ARGS: more gpu_coverage options; COV_TAG: names their
#                                  # stores and archive, so a second run in the same call starts cold, e.g.
#                                  # COV_TAG=none COV_ARGS="--switch-interval none" bash bench/gpu_batch.sh cov;
#                                  # COV_SHARED=1: a group's cases one after another in one process;
#                                  # COV_CASES=a,b: only those cases; COV_SERIAL=1: the groups one after another,
#                                  # so each case compiles alone on the host; COV_STORES=cold: no warm run; whole
#                                  # models only where COV_CASES names them: gpt2,llama_4layer,resnet50)
#   bash bench/gpu_batch.sh models # the whole models side by side, cold store, each in its own process, stopped
#                                  # with SIGINT at MODELS_LIMIT s (default: what is left of 570 s): a model
#                                  # unfinished by then gives the share of the part of its compile that ran
#   bash bench/gpu_batch.sh plan   # side by side on 8 cores each: the deploy flow (warm --artifact, replica,
#                                  # cold) and plan-only vs a full warm of GPT-2 over 13 families; first the
#                                  # runtime step's pieces; THEN_COV=cases: those coverage cases after the deploy
#   bash bench/gpu_batch.sh audit  # plan-only vs a full warm alone on the machine (bytecode written first)
#   bash bench/gpu_batch.sh profile  # the deploy flow beside cProfile runs (read them with pstats): a plan-only
#                                    # warm of GPT-2, then the five smallest coverage cases, cold then warm store;
#                                    # on Python >= 3.12 cProfile runs on sys.monitoring and records every thread,
#                                    # so Inductor's compile threads land in the compiling thread's callers: trust
#                                    # prescreen's own functions' counts, and gpu_coverage's CPU ms for its cost
# Needs the prescreen, diskcache and redis wheels under .whl/ (see the device README); writes to $OUT.
set -uo pipefail
[[ ${1:-} =~ ^(cov|models|plan|audit|profile)$ ]] || { echo "usage: bash bench/gpu_batch.sh cov|models|plan|audit|profile" >&2; exit 2; }
SMALL=pointwise_mutated_headroom,conv1d,conv2d,conv2d_channels_last,mm_epilogue,conv3d  # over or near 0.1% before
OUT=${OUT:-$(mktemp -d)}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
write_bytecode() {  # this device's torch came without bytecode: compile it, as pip does at install
  /usr/bin/time -f "compileall: %e s" timeout 120 python3 -m compileall -q -j 16 \
    "$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))')" \
    "$(python3 -c 'import os, transformers; print(os.path.dirname(transformers.__file__))')" /tmp/site
}
case "$1" in
  cov)
    if [[ -z ${COV_TAG:-} ]]; then  # once a call: a tagged second run would repeat it and overwrite its file
      write_bytecode > "$OUT/runtime_step.txt" 2>&1  # as pip does at install; a case's lazy imports are in its compile
      [[ -n ${NO_STEP_BENCH:-} ]] || python3 -P bench/bench_runtime_step.py --device cuda --reps 200 --skip-contended \
        >> "$OUT/runtime_step.txt" 2>&1
      tail -10 "$OUT/runtime_step.txt"
    fi
    group() {  # $1: name, $2: cases; a cold store, then the same store in fresh processes
      export PRESCREEN_CACHE_DIR=/tmp/store-$1${COV_TAG:-}
      local cases=$2 runs run f
      [[ -z ${COV_CASES:-} ]] || cases=$(tr , '\n' <<< "$2" | grep -xF -f <(tr , '\n' <<< "$COV_CASES") | paste -sd,)
      [[ -n $cases ]] || return 0
      runs=("$cases"); [[ -n ${COV_SHARED:-} ]] || IFS=, read -ra runs <<< "$cases"
      for run in "${runs[@]}"; do  # a case cold, then warm: a call cut off at its limit keeps whole pairs
        for s in ${COV_STORES:-cold warm}; do  # each run's rows printed as it ends
          f="$OUT/$1-$s-${run%%,*}"
          python3 -P bench/gpu_coverage.py --cases "$run" ${COV_ARGS:-} --json "$f.json" > "$f.txt" 2>&1
          grep "^| [a-z_0-9]* |" "$f.txt" | sed "s/^/${COV_TAG:+$COV_TAG }$s /" | cut -c1-300
        done
      done
    }
    # about even in compile seconds; in each group the cases over or near 0.1% before come first
    side() { if [[ -n ${COV_SERIAL:-} ]]; then "$@"; else "$@" & fi; }  # side by side unless COV_SERIAL
    side group a mm_epilogue,mm,mm_transposed,bmm,addmm_bias
    side group b mlp,transformer_block
    side group c conv2d,conv2d_channels_last,conv3d,conv2d_weight_heavy,int_mm
    [[ -z ${COV_CASES:-} ]] || side group e gpt2,llama_4layer,resnet50  # minutes each: only when named
    group d pointwise_mutated_headroom,conv1d,scaled_mm_fp8,flex_attention,pointwise_mutated,reduction_mutated
    wait
    cd "$OUT" && shopt -s nullglob && runs=(./*-cold* ./*-warm*) \
      && tar czf "cov${COV_TAG:+-$COV_TAG}.tgz" "${runs[@]}" && rm -f "${runs[@]}" ;;  # one file: $OUT brings back 8 at most
  models)
    write_bytecode > "$OUT/bytecode.txt" 2>&1
    limit=${MODELS_LIMIT:-$((570 - SECONDS))}
    for m in ${MODELS:-gpt2 llama_4layer resnet50}; do
      PRESCREEN_CACHE_DIR=/tmp/store-$m timeout -s INT -k 15 "$limit" python3 -P bench/gpu_coverage.py --cases "$m" \
        --json "$OUT/e-cold-$m.json" > "$OUT/e-cold-$m.txt" 2>&1 &
    done
    wait
    grep -h "^| [a-z_0-9]* |" "$OUT"/e-cold-*.txt | cut -c1-300
    cd "$OUT" && tar czf models.tgz ./e-cold-* && rm -f ./e-cold-* ;;
  plan)
    [[ -z ${PYC:-} ]] || write_bytecode > "$OUT/runtime_step.txt" 2>&1
    [[ -n ${NO_STEP_BENCH:-} ]] || python3 -P bench/bench_runtime_step.py --device cuda >> "$OUT/runtime_step.txt" 2>&1
    python3 -P -c "import os, sys, torch; d = os.path.dirname(torch.__file__); print('bytecode written:',
      not sys.flags.dont_write_bytecode, '| torch dir writable:', os.access(d, os.W_OK), '| torch/__pycache__:',
      os.path.isdir(os.path.join(d, '__pycache__')))" >> "$OUT/runtime_step.txt" 2>&1
    { timeout ${DEPLOY_LIMIT:-450} taskset -c 0-7 python3 -P bench/gpu_deploy.py --steps ${DEPLOY_STEPS:-warm,replica,cold} \
        --out "$OUT/deploy.md" > "$OUT/deploy.log" 2>&1
      if [[ -n ${THEN_COV:-} ]]; then  # the coverage cases named, cold then warm store, once the deploy steps are done
        for store in cold warm; do PRESCREEN_CACHE_DIR=/tmp/store-small taskset -c 0-7 python3 -P bench/gpu_coverage.py \
          --cases "$THEN_COV" --json "$OUT/cov-$store.json" > "$OUT/cov-$store.txt" 2>&1; done
      fi; } &
    timeout ${PLAN_LIMIT:-520} taskset -c 8-15 python3 -P bench/bench_plan_only.py --target gpu_deploy:gpt2 --device cuda \
      --shape batch=1..4096 --device-memory 24GiB --full-timeout ${FULL_LIMIT:-360} > "$OUT/plan_only.txt" 2>&1
    wait
    cat "$OUT/runtime_step.txt"; grep -v '^STEP' "$OUT/deploy.log" | tail -14; tail -8 "$OUT/plan_only.txt"
    grep -h "^| [a-z_0-9]* | True" "$OUT"/cov-*.txt 2>/dev/null ;;
  audit)
    write_bytecode > /dev/null 2>&1
    timeout ${PLAN_LIMIT:-560} python3 -P bench/bench_plan_only.py --target gpu_deploy:gpt2 --device cuda \
      --shape batch=1..4096 --device-memory 24GiB --full-timeout ${FULL_LIMIT:-480} 2>&1 | tee "$OUT/plan_only.txt" ;;
  profile)
    timeout ${DEPLOY_LIMIT:-300} taskset -c 0-7 python3 -P bench/gpu_deploy.py --steps ${DEPLOY_STEPS:-warm,replica} \
      --out "$OUT/deploy.md" > "$OUT/deploy.log" 2>&1 &
    export PYTHONPATH=/tmp/site:bench:examples TORCHINDUCTOR_CACHE_DIR=/tmp/plan-inductor PRESCREEN_CACHE_DIR=/tmp/plan-store
    { /usr/bin/time -f "import torch+transformers+prescreen: %e s" python3 -P -c \
        "import torch, transformers, prescreen.cli, prescreen.hooks.activation"; } > "$OUT/profile.txt" 2>&1
    taskset -c 8-15 python3 -P -c "import cProfile, sys; sys.argv = ['prescreen'] + sys.argv[1:]; from prescreen.cli import main
cProfile.run('main()', '$OUT/plan.prof')" warm gpu_deploy:gpt2 --device cuda --shape batch=1..4096 \
      --device-memory 24GiB --plan-only >> "$OUT/profile.txt" 2>&1
    unset TORCHINDUCTOR_CACHE_DIR
    export PYTHONPATH=/tmp/site PRESCREEN_CACHE_DIR=/tmp/cov-store
    for store in cold warm; do
      taskset -c 8-15 python3 -P -m cProfile -o "$OUT/cov-$store.prof" bench/gpu_coverage.py --cases $SMALL \
        >> "$OUT/profile.txt" 2>&1
    done
    wait
    grep -v '^STEP' "$OUT/deploy.log" | tail -12; grep -E "ROW|import|plan only|lowering" "$OUT/profile.txt" | cut -c1-400 ;;
esac
