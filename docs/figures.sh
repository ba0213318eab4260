#!/usr/bin/env bash
# Redraw the figures in docs/ from the runs their captions name. Each PNG records the command
# that drew it and the plotting package's hash (tests/test_figures.py checks both).
#
#   docs/figures.sh [DEMO]
#
# DEMO: a `surgery demo --quick` folder (seed 0); made in a scratch folder when not given.
# Needs the toolkit's virtual environment on PATH (`surgery` and its `python`).
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
# Search (docs/search.md), compare (docs/study.md) and the demo's strategies (docs/demo.md), all
# on the same quick demo. Run from a scratch folder holding links to DEMO's models/ and scores/
# and a copy of its data/, so each PNG's command reads as the docs quote it.
mkdir "$work/e" && cd "$work/e"
mkdir runs
mkdir runs/demo && ln -s "$demo/models" runs/demo/models && ln -s "$demo/scores" runs/demo/scores
cp -r "$demo/data" runs/demo/data
# suite-slavic.yml: the demo's suite with the Slavic family alone and the ppl task.
python - <<'PY'
import yaml
suite = yaml.safe_load(open("runs/demo/data/suite.yml"))
suite["families"] = {"slavic": suite["families"]["slavic"]}
keep = {"gen_Latn", *suite["families"]["slavic"]["held_in"], *suite["families"]["slavic"]["held_out"]}
suite["languages"] = {k: v for k, v in suite["languages"].items() if k in keep}
suite["tasks"] = {"ppl": suite["tasks"]["ppl"]}
yaml.safe_dump(suite, open("runs/demo/data/suite-slavic.yml", "w"), sort_keys=False)
PY
OMP_NUM_THREADS=1 surgery search runs/demo/models/base runs/demo/models/expert-slavic \
    --suite runs/demo/data/suite-slavic.yml -o runs/demo/search-expert \
    --blocks 6 --embeddings --trials 40 --budget "held_in ppl <= 30" --sampler tpe >/dev/null
OMP_NUM_THREADS=1 surgery search runs/demo/models/base runs/demo/models/dense \
    --suite runs/demo/data/suite.yml -o runs/demo/search-dense \
    --blocks 6 --embeddings --trials 40 --budget "held_in ppl <= 124" --sampler tpe >/dev/null
OMP_NUM_THREADS=1 surgery search runs/demo/models/base \
    runs/demo/models/expert-{slavic,germanic,indic,austro,romance} \
    --suite runs/demo/data/suite.yml -o runs/demo/search-experts --blocks 3 --trials 40 \
    --sampler tpe >/dev/null
cp runs/demo/search-expert/frontier.png "$docs/search_expert.png"
cp runs/demo/search-dense/frontier.png "$docs/search_dense.png"
cp runs/demo/search-experts/frontier.png "$docs/search_experts.png"
surgery compare runs/demo/scores/dense runs/demo/scores/dense-reverted runs/demo/scores/ema \
    runs/demo/scores/soup --base runs/demo/scores/base -o runs/demo/compare --resamples 1000 \
    >/dev/null
cp runs/demo/compare/change_heatmap.png "$docs/compare_heatmap.png"
cp runs/demo/compare/tradeoff.png "$docs/compare_tradeoff.png"
# The demo again on its finished run: every stage is reused, the report and its plot redrawn.
cd "$work" && rm -rf e/runs/demo && mkdir -p e2/runs && cp -r "$demo" e2/runs/demo && cd e2
surgery demo --quick -o runs/demo >/dev/null
cp runs/demo/strategies.png "$docs/demo_strategies.png"

# docs/search_samplers.png is drawn by `python bench/bench_search_samplers.py` (about 20 minutes
# on 2 CPUs; docs/search.md gives its table), not here.
