"""Benchmark: optuna's samplers in `surgery search` at equal trials, on the demo's world.

The world (`tiny_world`) is the smallest with a real trade-off, in the demo's languages: a
tiny Llama (6 layers, hidden 32) pretrained on the demo's general language, then an expert
trained from it on one Slavic language, which learns it and forgets the general one; the suite
scores perplexity on both (learning: held in; forgetting: `others`), 32 documents each, 16
per half. It takes seconds to build. `--demo DIR` uses the quick demo's base and Slavic expert
instead (`surgery demo --quick -o DIR`; built into DIR if missing: the base's pretraining and
one expert's training, minutes on an idle machine), with the demo's suite restricted to the
Slavic family and the perplexity task.

Each sampler (tpe, nsga2, gp, random) searches `--trials` trials (6 blocks and the embeddings)
for each seed, the samplers taking turns within a seed (a shared machine's load falls on all
of them alike). After every `--every` trials, the frontier so far (chosen on the search half)
is scored on the report half and its hypervolume taken against the report half's reference
point (the worst of BASE and the expert on each objective; perplexities as logarithms, as
`surgery search` reports it). Prints each search's final value and wall time, then per sampler
and trial count the median [min, max] over the seeds, and the machine's load; draws the
medians and ranges against trials into `--figure`.

Run by hand:  python bench/bench_search_samplers.py [--trials 30] [--seeds 0,1,2] [--demo DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))

SAMPLERS = ("tpe", "nsga2", "gp", "random")
EXPERT = "expert-slavic"


def tiny_world(root: Path, layers: int = 6, docs: int = 32) -> tuple[Path, Path, Path]:
    """BASE (pretrained on the general language), the expert (BASE trained on a Slavic one)
    and their suite, under `root` (reused when there)."""
    from tests.support import search_world, tiny_models

    suite = root / "data" / "suite.yml"
    if suite.is_file():
        return root / "base", root / "expert", suite
    texts = search_world._texts(600, 1)
    base = _trained(None, texts[search_world.OTHER], layers, steps=300)
    expert = _trained(base, texts[search_world.HELD_IN], layers, steps=60)
    tiny_models.save(base.to(_bf16()), root / "base")
    tiny_models.save(expert.to(_bf16()), root / "expert")
    for lang, lines in search_world._texts(docs * 2, 7).items():
        folder = root / "data" / "ppl" / lang
        folder.mkdir(parents=True)
        rows = [" ".join(lines[i : i + 2]) for i in range(0, len(lines), 2)]
        (folder / "docs.jsonl").write_text("".join(json.dumps({"text": r}) + "\n" for r in rows))
    suite.write_text(search_world.SUITE, encoding="utf-8")
    return root / "base", root / "expert", suite


def _bf16():
    import torch

    return torch.bfloat16


def _trained(start, lines: list[str], layers: int, steps: int):
    """A tiny Llama (a new one when `start` is None, else a copy of it) trained on `lines`."""
    import copy

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.support.tiny_models import make_tokenizer, vocab_size

    torch.manual_seed(0)
    if start is None:
        config = LlamaConfig(
            vocab_size=vocab_size(), hidden_size=32, intermediate_size=64,
            num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1,
            max_position_embeddings=128, tie_word_embeddings=False, bos_token_id=1,
            eos_token_id=2, pad_token_id=0,
        )  # fmt: skip
        model = LlamaForCausalLM(config)
    else:
        model = copy.deepcopy(start)
    ids = torch.tensor(make_tokenizer()(" ".join(lines))["input_ids"])
    windows = ids[: len(ids) // 48 * 48].view(-1, 48)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        batch = windows[torch.randint(len(windows), (16,), generator=generator)]
        model(input_ids=batch, labels=batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model


def demo_world(root: Path) -> tuple[Path, Path, Path]:
    """The quick demo's base and Slavic expert (seed 0) and the Slavic perplexity suite, built
    into `root` unless already there."""
    from demo import pipeline
    from demo.world import WorldFiles, build_languages

    size, seed, models = pipeline.QUICK, 0, root / "models"
    data = root / "data"
    if not (data / "suite.yml").is_file():
        pipeline._make_world(data, size, seed)
    world = WorldFiles(data, build_languages(seed))
    if not (models / "base-init" / "config.json").is_file():
        pipeline.init_base(world, size, models / "base-init", seed)
    runs = pipeline.training_runs(world, size)
    for name in ("base", EXPERT):
        if not (models / name / "surgery_train.json").is_file():
            pipeline._train(pipeline.train_config(models, name, runs[name], seed))
    suite = data / "suite-slavic.yml"
    suite.write_text(slavic_suite((data / "suite.yml").read_text()))
    return models / "base", models / EXPERT, suite


def slavic_suite(text: str) -> str:
    """The demo's suite with the Slavic family alone, its languages and the base's own
    (`others:`), and the perplexity task alone (as docs/figures.sh writes suite-slavic.yml)."""
    import yaml

    suite = yaml.safe_load(text)
    slavic = suite["families"]["slavic"]
    suite["families"] = {"slavic": slavic}
    keep = {*slavic["held_in"], *slavic["held_out"], *suite.get("others", [])}
    suite["languages"] = {k: v for k, v in suite["languages"].items() if k in keep}
    suite["tasks"] = {"ppl": suite["tasks"]["ppl"]}
    return yaml.safe_dump(suite, sort_keys=False)


def one_search(base: Path, expert: Path, suite: Path, sampler: str, seed: int, args) -> dict:
    """One search; the report half's hypervolume of its frontier after every `args.every`
    trials, and its wall time."""
    from eval.search import hypervolume as hv
    from eval.search import storage as st
    from eval.search.files import prepare_half
    from eval.search.run import SearchOptions, run_search
    from eval.study.runner import SuiteRun

    with tempfile.TemporaryDirectory() as tmp:
        options = SearchOptions(
            base=str(base),
            trained=str(expert),
            suite=suite,
            out=Path(tmp) / "search",
            blocks=str(args.blocks),
            embeddings=True,
            trials=args.trials,
            seed=seed,
            quiet=True,
            sampler=sampler,
        )
        start = time.perf_counter()
        searcher = run_search(options, SuiteRun(progress=False))
        wall = time.perf_counter() - start
        checked = searcher.checked
        report = prepare_half(options, checked.search.options, "report", checked.objectives)
        scored: dict[str, list[float]] = {}

        def on_report(profile: str) -> list[float]:
            if profile not in scored:
                values = searcher.values(profile, report, "point")
                scored[profile] = [values[o.key] for o in checked.objectives]
            return scored[profile]

        higher = [o.measure.higher for o in checked.objectives]
        metrics = [o.measure.metric for o in checked.objectives]
        frame = hv.Frame.of(higher, metrics, [on_report("0"), on_report("1")])
        trials = st.finished(searcher.study)
        curve = {}
        for count in range(args.every, args.trials + 1, args.every):
            front = hv.nondominated([t.values for t in trials[:count]], higher)
            profiles = [trials[i].user_attrs["profile"] for i in front]
            curve[count] = frame.volume([on_report(p) for p in profiles])
    return {"curve": curve, "wall": wall, "scored": len(scored)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--world", type=Path, default=None, help="where the tiny world is kept [a temporary folder]"
    )
    parser.add_argument("--demo", type=Path, default=None, help="the quick demo's folder instead")
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--every", type=int, default=10, help="trials between report scorings")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--samplers", default=",".join(SAMPLERS))
    parser.add_argument("--figure", type=Path, default=Path("docs/search_samplers.png"))
    parser.add_argument(
        "--results", type=Path, default=Path("search_samplers.json"), help="every seed's curve"
    )
    parser.add_argument("--redraw", type=Path, default=None, help="draw a --results file again")
    args = parser.parse_args()
    if args.redraw is not None:
        saved = json.loads(args.redraw.read_text())
        draw(saved["results"], args.figure, saved["world"])
        return
    import torch

    torch.set_num_threads(1)  # the searches run one after another, each on one thread
    with tempfile.TemporaryDirectory() as tmp:
        if args.demo is not None:
            base, expert, suite = demo_world(args.demo)
        else:
            base, expert, suite = tiny_world(args.world or Path(tmp) / "world")
        run_all(base, expert, suite, args)


def run_all(base: Path, expert: Path, suite: Path, args) -> None:
    """Every sampler on every seed, then the table and the figure."""
    samplers = args.samplers.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    results: dict[str, list[dict]] = {s: [] for s in samplers}
    for seed in seeds:
        for sampler in samplers:
            result = one_search(base, expert, suite, sampler, seed, args)
            results[sampler].append(result)
            final = result["curve"][max(result["curve"])]
            print(
                f"seed {seed} {sampler:6s} {result['wall']:6.1f} s, report-half hypervolume "
                f"{final:.4f}; load {os.getloadavg()[0]:.2f}",
                flush=True,
            )
    print_table(results, args)
    args.results.write_text(json.dumps({"world": _world(args), "results": results}, indent=1))
    draw(results, args.figure, _world(args))
    print(f"wrote {args.results}")
    print(f"wrote {args.figure}")


def print_table(results: dict[str, list[dict]], args) -> None:
    """Per sampler: the report half's hypervolume at each trial count, median [min, max] over
    the seeds, and the searches' median wall time."""
    counts = sorted(next(iter(results.values()))[0]["curve"])
    print(
        f"\nreport-half hypervolume, median [min, max] over {len(next(iter(results.values())))} "
        f"seeds; {args.blocks} blocks + embeddings, {_world(args)}"
    )
    print("trials  " + "  ".join(f"{s:>22s}" for s in results))
    for count in counts:
        cells = []
        for runs in results.values():
            values = [r["curve"][count] for r in runs]
            cells.append(f"{statistics.median(values):.3f} [{min(values):.3f}, {max(values):.3f}]")
        print(f"{count:6d}  " + "  ".join(f"{c:>22s}" for c in cells))
    walls = "  ".join(
        f"{s} {statistics.median(r['wall'] for r in runs):.0f} s" for s, runs in results.items()
    )
    print(f"median wall time per search: {walls}; load average {os.getloadavg()[0]:.2f}")


def _world(args) -> str:
    return "quick demo's Slavic expert" if args.demo else "tiny world (demo languages)"


def draw(results: dict[str, list[dict]], path: Path, world: str) -> None:
    """Median and range of the report half's hypervolume against trials, one line per
    sampler, drawn through surgery.plotting (house style, command and hash in the PNG)."""
    from surgery.plotting import SERIES, figure, legend_below, save_figure

    fig, ((axes,),) = figure("full", 8.0)
    for colour, (sampler, runs) in zip(SERIES, results.items(), strict=False):
        counts = sorted(runs[0]["curve"], key=int)
        values = [[r["curve"][c] for r in runs] for c in counts]
        trials = [int(c) for c in counts]
        medians = [statistics.median(v) for v in values]
        axes.plot(trials, medians, marker="o", color=colour, label=f"{sampler} (median)")
        axes.fill_between(
            trials, [min(v) for v in values], [max(v) for v in values], alpha=0.15, color=colour
        )
    axes.set_xlabel("trials")
    axes.set_xticks(trials)
    axes.set_ylabel("report-half hypervolume\n(higher is better)")
    axes.set_title(f"Samplers on the {world}: median and range over {len(runs)} seeds")
    legend_below(fig, axes.get_legend_handles_labels()[0])
    save_figure(fig, path, shlex.join(["python", "bench/bench_search_samplers.py", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
