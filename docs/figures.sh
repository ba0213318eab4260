#!/usr/bin/env bash
# Redraw the figures in docs/ from the runs their captions name. Each PNG records the command
# that drew it and the plotting package's hash (tests/test_figures.py checks both).
#
#   docs/figures.sh [DEMO]
#
# DEMO: a `surgery demo --quick` folder (seed 0); made in a scratch folder when not given.
# Commands run from a scratch folder holding links to DEMO's models/ and data/, so each PNG's
# command reads as the docs quote it (`surgery drift models/base models/expert-slavic ...`).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
docs=$repo/docs
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export PYTHONPATH=$repo${PYTHONPATH:+:$PYTHONPATH}

demo=${1:-}
if [ -z "$demo" ]; then
    demo=$work/demo
    surgery demo --quick -o "$demo"
fi
demo=$(cd "$demo" && pwd)

# --- surgery-side figures: the quick demo (docs/diagnostics.md, docs/similarity.md) ---
mkdir "$work/q" && cd "$work/q"
ln -s "$demo/models" models && ln -s "$demo/data" data
surgery drift -q models/base models/expert-slavic --plot drift.png
surgery sweep -q --alphas 0:1:0.5 models/base models/expert-slavic -o sweep --no-save \
    -t ppl:data/ppl_gen:name=gen -t ppl:data/ppl_heldin/data/sla1:name=heldin
surgery localize -q models/base models/dense --blocks 0:2,2:5,5:6 -o localize \
    -t ppl:data/ppl_gen:name=gen -t copain:n=30,shots=3
surgery drift -q models/base models/expert-slavic models/expert-germanic models/expert-indic \
    models/expert-austro models/expert-romance --labels slavic,germanic,indic,austro,romance \
    --plot similarity_heatmap.png
cp drift.png sweep/sweep.png localize/localize.png similarity_heatmap.png "$docs/"

# --- the sliding-window curve: a 12-layer tiny Llama trained in layers 4-6 (localization.md) ---
mkdir "$work/w" && cd "$work/w"
ln -s "$repo/tests" tests
python -c "from tests.support.tiny_models import random_llama; random_llama('base', hidden=32, layers=12)"
surgery train base trained --data tests/data/eval/held_out.txt --freeze 0:4,7:12 \
    --freeze-embeddings --max-steps 6 --block-size 16 --batch-size 2 --lr 1e-2 >/dev/null
surgery localize -q base trained --window 3 --stride 1 -o window \
    -t ppl:tests/data/eval/held_out.txt:name=trained_text
cp window/localize.png "$docs/localize_window.png"

# --- eval and demo figures: search, compare, the demo's strategies (added by their owners) ---
