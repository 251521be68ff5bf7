#!/usr/bin/env bash
# Issue 49's device run, in one call of under 10 minutes on one GPU: the peers' table
# (benchmarks/gpu/bench_peers.py, bf16, the issue's shapes) into results/bench/bench_peers.jsonl
# and the route cost table (benchmarks/gpu/route_costs.py) into results/gpu/routes.jsonl, each
# record with the device, torch version, commit and route. Then, on any machine with the
# checkout: `make report` renders the table into docs/benchmarks.md.
# Usage: benchmarks/gpu/run.sh [RESULTS_DIR]   (default: results; $OUT/results on a device
# machine whose results come back through $OUT)
set -euo pipefail
cd "$(dirname "$0")/../.."
results="${1:-${OUT:+$OUT/results}}"
results="${results:-results}"
mkdir -p "$results/bench" "$results/gpu"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python -c "import torch; assert torch.cuda.is_available(), 'run.sh needs a CUDA device'"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
# the cost table first (the rule's own shapes; each row appended as measured), then the peers'
# table (the docs render it; a SIGTERM stores the rows measured, each failed case stored with
# its error); each bounded, with a kill 15 s after the stop: 140 + 360 + 2 × 15 s < 9 minutes
timeout -k 15 140 python benchmarks/gpu/route_costs.py --repeat 5 --store "$results/gpu/routes.jsonl" \
    || echo "route_costs stopped (exit $?): its rows so far are stored"
timeout -k 15 360 python benchmarks/gpu/bench_peers.py --repeat 10 --store "$results/bench" \
    || echo "bench_peers stopped (exit $?)"
