#!/usr/bin/env bash
# Issue 28: what one FedRC training round of the CPU image recipe (FashionCNN(channels=(16, 32),
# hidden=128), 5 local steps of 32, SGD momentum kept per client) and of the paper recipe
# (FashionCNN 32/64/2048, 1 local step of 128) costs on one CUDA GPU: wall seconds per round
# (median over the rounds after the first, validation off) and torch's peak GPU memory in the fit,
# with the loop and the vectorized executor. 30 clients from from_tensors on 5,000 random 28x28
# images generated here (nothing is downloaded; the round's cost does not depend on the pixels),
# K = 3, every client every round. Needs python3 with torch, lightning, scikit-learn; not the
# package installed (run from the repository root with PYTHONPATH=$PWD) nor jsonargparse.
#
#   export PYTHONPATH=$PWD && bash benchmarks/gpu_round_cost.sh          # about a minute on an H100
#   ACCELERATOR=cpu ROUNDS=1 CLIENTS=6 bash benchmarks/gpu_round_cost.sh  # a CPU smoke run
#
# Prints a table to stdout and, when $OUT is set, writes it to "$OUT/gpu_round_cost.txt" (each
# run's full output beside it in "$OUT/gpu_round_cost.log").
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="${PYTHONPATH:-$PWD}"
ACCELERATOR=${ACCELERATOR:-gpu}
ROUNDS=${ROUNDS:-3}
CLIENTS=${CLIENTS:-30}
RUN_TIMEOUT=${RUN_TIMEOUT:-60}
EXECUTORS=${EXECUTORS:-loop vectorized}
PYTHON=${PYTHON:-python3}
LOG=$(mktemp)
TABLE=$(mktemp)

SMALL=(--model small --local-steps 5 --batch 32 --lr 0.05 --momentum 0.9 --optimizer-state persist)
PAPER=(--model paper --local-steps 1 --batch 128 --lr 0.06 --momentum 0.9 --weight-decay 5e-4
    --optimizer-state persist)
COMMON=(--dataset random5k --clients "$CLIENTS" --rounds "$ROUNDS" --eval-every 100000 --seeds 0
    --no-test --clock wall --accelerator "$ACCELERATOR")

run() {  # name, executor, recipe arguments...
    local name=$1 executor=$2
    shift 2
    local started=$SECONDS
    local output
    output=$(timeout "$RUN_TIMEOUT" "$PYTHON" benchmarks/cpu_image_recipe.py "$@" "${COMMON[@]}" \
        --executor "$executor" 2>&1)
    local status=$?
    { echo "=== $name, executor $executor (exit $status, $((SECONDS - started)) s)"; echo "$output"; } >> "$LOG"
    local cost
    cost=$(grep '^cost:' <<< "$output" | tail -n 1)
    if [[ $status -ne 0 || -z $cost ]]; then
        printf '%-8s %-11s %12s %14s   %s\n' "$name" "$executor" "-" "-" \
            "failed (exit $status): $(tail -n 1 <<< "$output" | cut -c1-80)" >> "$TABLE"
        return
    fi
    local seconds peak
    seconds=$(sed -E 's/.*round_s=([0-9.]+).*/\1/' <<< "$cost")
    peak=$(sed -E 's/.*peak_mb=([0-9]+).*/\1/' <<< "$cost")
    printf '%-8s %-11s %12s %14s   %s\n' "$name" "$executor" "$seconds" "$peak" \
        "$(grep '^data:' <<< "$output" | grep -oE 'FashionCNN [a-z]+ \{[^}]*\}')" >> "$TABLE"
}

CHECK="import sys, torch, lightning, sklearn, lightning_fedcluster
sys.exit('$ACCELERATOR' == 'gpu' and not torch.cuda.is_available() and 'torch sees no CUDA device')"
if ! "$PYTHON" -c "$CHECK" 2> "$LOG"; then
    echo "gpu_round_cost.sh cannot run here (from the repository root with PYTHONPATH=\$PWD, it needs"
    echo "torch, lightning, torchmetrics, scikit-learn, matplotlib; ACCELERATOR=cpu without a GPU):"
    tail -n 3 "$LOG"
    exit 1
fi

started=$SECONDS
for executor in $EXECUTORS; do
    run small "$executor" "${SMALL[@]}"
    run paper "$executor" "${PAPER[@]}"
done

report() {
    grep -m 1 '^machine:' "$LOG" || echo "machine: (no run printed one)"
    echo "command: ACCELERATOR=$ACCELERATOR ROUNDS=$ROUNDS CLIENTS=$CLIENTS bash benchmarks/gpu_round_cost.sh"
    echo "FedRC K=3, $CLIENTS clients from from_tensors on 5,000 random 28x28 images (cost only), every"
    echo "client every round, $ROUNDS rounds, float32; small = 5 local steps of 32, paper = 1 local step of 128"
    printf '%-8s %-11s %12s %14s   %s\n' recipe executor "s/round" "peak MB" model
    cat "$TABLE"
    echo "s/round: wall seconds of a training round, median after the first; peak MB: torch's peak"
    echo "GPU memory allocated in the fit (on CPU: the process's peak RSS); total $((SECONDS - started)) s"
}
report
if [[ -n ${OUT:-} ]]; then
    mkdir -p "$OUT"
    report > "$OUT/gpu_round_cost.txt"
    cp "$LOG" "$OUT/gpu_round_cost.log"
fi
rm -f "$LOG" "$TABLE"
