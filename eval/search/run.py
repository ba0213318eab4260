"""The search itself: check everything, load the models once, run trials until N or the time.

Order of work: the options, the suite's objectives and budgets, the checkpoints' headers (the
stack's layers: blocks and baselines), the output folder, and every unit's data and halves are
checked before any model loads; bad input is one line and nothing is written. Then the study
is opened (created with the baselines enqueued, or resumed), TRAINED is loaded once and BASE's
tensors read once (`MemoryBlender`), BASE is scored on the search half (the reference of the
budgets), and each trial sets the blend in place and scores the search half. At the end the
frontier is scored on the report half (`eval.search.report`).

With several experts the first is loaded and BASE's and the others' tensors are read once
(`eval.search.blend.SoupBlender`); their architectures, families and the expected memory are
checked first (`eval.search.experts`).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eval.search import priors
from eval.search import storage as st
from eval.search.files import prepare_half, write_json
from eval.search.objectives import Budget, Measures, Objective, parse_budget, parse_objectives
from eval.search.priors import seeds
from eval.search.pruning import SHARES, Pruner
from eval.search.settings import SearchOptions
from eval.search.space import Baseline, Space, baselines, paper_band, parse_blocks
from eval.study.compare import compare_runs
from eval.study.memory import PreparedSuite, score_suite, summary
from eval.study.runner import SuiteRun
from eval.study.suite import load_suite
from surgery.core.errors import OutputError, SurgeryError
from surgery.core.layers import parse_layer_spec, select_stack
from surgery.core.threads import rebalance_threads
from surgery.diagnostics.localize import pair_identity

SETTINGS_FILE = "search.json"  # DIR's record of the search's settings: DIR is this search's
COMPOSED = "blocks-{}.json"  # `--seed-profiles blocks`: round R's composition, once enqueued


@dataclass
class Checked:
    """A search with every input checked: the space, objectives, budgets, baselines, the
    checkpoints (opened, headers only) and the search half's units."""

    options: SearchOptions
    space: Space
    objectives: list[Objective]
    budgets: list[Budget]
    baselines: list[Baseline]
    base: Any
    trained: Any
    stack: Any
    search: PreparedSuite
    experts: list[Any] = field(default_factory=list)  # the opened experts (TRAINED first)
    labels: list[str] = field(default_factory=list)  # their families, when known

    @property
    def measured(self) -> list[Objective]:
        """The objectives, then each budget's objective not among them."""
        extra = [b.objective for b in self.budgets if b.objective not in self.objectives]
        return [*self.objectives, *dict.fromkeys(extra)]

    def settings(self) -> dict[str, Any]:
        """What identifies the search (a resumed run or a second worker must match it)."""
        options = self.options
        return {
            "base": str(options.base),
            "trained": str(options.trained),
            "suite_sha256": _sha(self.search.suite),
            "eval": {k: v for k, v in self.search.settings.items()},
            "blocks": [list(b) for b in self.space.blocks],
            "embeddings": self.space.embeddings,
            "step": self.space.step,
            "objectives": [str(o) for o in self.objectives],
            "budgets": [b.text for b in self.budgets],
            "baselines": [b.profile for b in self.baselines],
            "seed": options.seed,
            "sampler": options.sampler,
            # Several experts only: a search of one expert keeps the settings it always had.
            **({"experts": list(options.inputs), "labels": self.labels} if self.several else {}),
        }

    @property
    def several(self) -> bool:
        """Whether the search mixes several experts."""
        return len(self.experts) > 1


def _sha(value: Any) -> str:
    from eval.study.results import suite_sha256

    return suite_sha256(value)


def check(options: SearchOptions, scoring: SuiteRun) -> Checked:
    """Every check that needs no model (see the module docstring); `scoring`: how the models
    are scored (the split seed of the halves included).

    Raises:
        SurgeryError, SuiteError, EvalDataError, TaskSpecError, LayerSpecError, OutputError.
    """
    from surgery.api import warn_if_swapped

    if not (options.base and options.inputs) or options.suite is None or options.out is None:
        raise SurgeryError("a search needs BASE, TRAINED, a suite and an output folder")
    if options.trials < 1:
        raise SurgeryError(f"--trials must be at least 1, not {options.trials}")
    if options.time is not None and options.time <= 0:
        raise SurgeryError(f"--time must be positive, not {options.time:g}")
    if options.sampler not in st.SAMPLERS:
        raise SurgeryError(f"--sampler {options.sampler}: use {', '.join(st.SAMPLERS)}")
    if not 0 < options.step <= 1:
        raise SurgeryError(f"--step must lie in (0, 1], not {options.step:g}")
    measures = Measures(load_suite(options.suite))
    objectives = parse_objectives(measures, options.measure, options.objectives)
    budgets = [parse_budget(measures, text) for text in options.budgets]
    base, experts, labels = _open_models(options, measures, scoring)
    trained = experts[0]
    for expert in experts:
        warn_if_swapped(base, expert)
    stack = select_stack(trained.stacks)
    space = Space(parse_blocks(options.blocks, stack.num_layers), stack.num_layers)
    several = tuple(labels) if len(experts) > 1 else ()
    space = Space(space.blocks, space.num_layers, options.embeddings, options.step, several)
    band = (
        parse_layer_spec(options.baseline_layers, stack.num_layers)
        if options.baseline_layers
        else list(range(*paper_band(stack.num_layers)))
    )
    points = baselines(space, band, options.uniform)
    points += seeds(space, options.seed_profiles, pair_identity(base, trained), points)
    needed = len(points) + _composes(options)  # `blocks` adds its composition
    if options.trials < needed:
        raise SurgeryError(
            f"--trials {options.trials}: the baselines and seed profiles alone are {needed} "
            "trials; give more"
        )
    check_folder(options.out, [base.path, *(e.path for e in experts)])
    needed = [*objectives, *(b.objective for b in budgets)]
    search = prepare_half(options, scoring, "search", needed)
    checked = Checked(
        options, space, objectives, budgets, points, base, trained, stack, search, experts, labels
    )
    _check_resume(options.out, checked.settings())
    return checked


def _composes(options: SearchOptions) -> bool:
    """Whether the search seeds `blocks` (its probes, then their composition)."""
    return any(priors.parse_seed(text)[0] == priors.BLOCKS for text in options.seed_profiles)


def _open_models(
    options: SearchOptions, measures: Measures, scoring: SuiteRun
) -> tuple[Any, list[Any], list[str]]:
    """BASE and the experts opened (headers only), the experts' families (`--labels`, their
    folders' names; none for one expert without `--labels`), and the memory checked.

    Raises:
        SurgeryError: experts of other architectures or layer counts, a family the suite lacks,
            or models that do not fit in memory.
    """
    from eval.model_loading import dtype_name
    from eval.search.experts import check_experts, check_memory, family_labels
    from surgery.hub.resolve import open_input

    base, experts = open_input(options.base), [open_input(p) for p in options.inputs]
    labels = []
    if len(experts) > 1 or options.labels is not None:
        check_experts(experts)
        families = [family.name for family in measures.suite.families]
        labels = family_labels(options.inputs, options.labels, families)
    check_memory([*experts, base], dtype_name(scoring.dtype, scoring.device), scoring.device)
    return base, experts, labels


def check_folder(out: Path, inputs: list[Path]) -> None:
    """DIR may be new, empty, or this search's (resumed); never an input, inside one, or a
    folder holding anything else.

    Raises:
        OutputError: with the reason.
    """
    from surgery.engine.output_paths import check_output, check_resumable_folder

    check_output(out, inputs, force=True)  # overlaps with the inputs, whatever exists
    check_resumable_folder(out)
    # A worker starting beside another may find search.json still being written (its partial).
    names = [p.name for p in out.iterdir()] if out.is_dir() else []
    if names and not any(n == SETTINGS_FILE or n.startswith(f"{SETTINGS_FILE}.") for n in names):
        raise OutputError(
            f"output {out} exists and holds no search (no {SETTINGS_FILE}); choose another"
        )


def _check_resume(out: Path, settings: dict[str, Any]) -> None:
    """A resumed DIR must hold a search with the same settings."""
    path = out / SETTINGS_FILE
    if not path.is_file():
        return
    found = json.loads(path.read_text(encoding="utf-8"))
    if found != json.loads(json.dumps(settings)):
        key = next(k for k in sorted(set(found) | set(settings)) if found.get(k) != settings.get(k))
        raise OutputError(f"{out} holds another search ({key} differs); choose another folder")


def run_search(options: SearchOptions, scoring: SuiteRun) -> Searcher:
    """Run (or resume, or join) a search: its trials, in DIR's storage (`eval.search.report`
    then writes the frontier and its report).

    Returns:
        The searcher, its models still loaded (to score the report half).
    """
    checked = check(options, scoring)
    out = options.out
    out.mkdir(parents=True, exist_ok=True)
    settings = checked.settings()
    write_json(out / SETTINGS_FILE, settings)
    searcher = Searcher(checked)
    searcher.open(st.open_storage(out, options.storage))
    searcher.load()
    searcher.optimize()
    return searcher


class Searcher:
    """The loaded models and the study: scores profiles and runs trials."""

    def __init__(self, checked: Checked) -> None:
        self.checked = checked
        self.options = checked.options
        self.study: Any = None
        self.blender: Any = None
        self.base_values: dict[tuple, float] = {}
        self.pruner: Any = None

    def open(self, storage: Any) -> None:
        """Open (create or load) the study; enqueue the baselines when this worker created it;
        fail and enqueue again the trials of killed workers."""
        checked = self.checked
        directions = ["maximize" if o.measure.higher else "minimize" for o in checked.objectives]
        options = self.options
        opened = st.open_study(
            storage, checked.settings(), directions, options.seed, options.sampler, options.trials
        )
        self.study = opened.study
        if opened.created:
            for point in checked.baselines:
                attrs = {"baseline": point.name, "profile": point.profile}
                if getattr(point, "family", None):  # a seed profile (`eval.search.priors`)
                    attrs["family"] = point.family
                self.study.enqueue_trial(checked.space.complete(point.strengths), user_attrs=attrs)
        st.requeue_stale(self.study)

    def load(self) -> None:
        """Load TRAINED once, read BASE's tensors (and the other experts'), and score BASE on
        the search half."""
        from eval.search.blend import SoupBlender
        from surgery.diagnostics.memory_blend import MemoryBlender

        checked = self.checked
        loader = _loader(checked.search.options)
        if checked.several:
            self.blender = SoupBlender(checked.base, checked.experts, loader)
        else:
            self.blender = MemoryBlender(checked.base, checked.trained, loader)
        base = self.run("0", checked.search, "base")
        self.base_values = self.measure(base)
        self.pruner = Pruner(self, base, SHARES if self.options.prune else (1.0,))

    def blend(self, profile: str) -> None:
        """Set the model's weights to the profile (an --alpha string), as interpolate would;
        with several experts, as `surgery merge` writes the profile's config."""
        from surgery.engine.ops.interpolate import resolve_alphas

        if self.checked.several:
            from eval.search.mix import mix_of

            stack = self.checked.stack
            mix = mix_of(profile, stack.num_layers, len(self.checked.experts))
            self.blender.set_mix(mix, self.blender.stack(stack.name))
            return
        values, stack, modules = resolve_alphas(self.checked.trained, profile, None, None)
        memory_stack = self.blender.stack(stack.name) if stack is not None else None
        self.blender.set_alphas(values, memory_stack, modules)

    def run(self, profile: str, prepared: PreparedSuite, name: str) -> Any:
        """The profile's blend scored on `prepared`'s units: a compare run."""
        self.blend(profile)
        return score_suite(self.blender.model, self.blender.tokenizer, prepared, name)

    def values(self, profile: str, prepared: PreparedSuite, name: str) -> dict[tuple, float]:
        """The measured objectives' values of a profile on `prepared`'s items."""
        return self.measure(self.run(profile, prepared, name))

    def measure(self, run: Any) -> dict[tuple, float]:
        """The measured objectives' values of a scored run."""
        values = summary(compare_runs([run], resamples=1), run.name)
        return {o.key: values[o.key] for o in self.checked.measured}

    def objective(self, trial: Any) -> list[float]:
        """One trial: its profile (a baseline's own, or the sampled strengths), its blend
        scored on the search half, the budgets' violations as constraints."""
        import optuna

        checked = self.checked
        trial.set_user_attr(st.WORKER, st.worker_id())
        if not st.may_start(self.study, trial.number, self.options.trials):
            self.study.stop()
            raise optuna.TrialPruned(f"{self.options.trials} trials are done or running")
        space = checked.space
        strengths = {
            name: space.snap(trial.suggest_float(name, 0.0, 1.0, step=space.step))
            for name in space.params
        }
        profile = trial.user_attrs.get("profile") or space.profile(strengths)
        values = self.pruner.values(trial, profile)  # raises TrialPruned for a trial cut short
        trial.set_user_attr("profile", profile)
        trial.set_user_attr("search", [values[o.key] for o in checked.measured])
        for index, budget in enumerate(checked.budgets):
            key = budget.objective.key
            trial.set_constraint(
                f"budget {index}", budget.violation(values[key], self.base_values[key])
            )
        return [values[o.key] for o in checked.objectives]

    def compose_blocks(self) -> None:
        """`--seed-profiles blocks`'s next composition: once the round's context (the soup,
        then the last composition) and its probes are complete, enqueue their composition
        (`priors.compose`) and, when it changed a block, the next round's probes around it.
        Once over every worker: the worker that creates DIR/blocks-R.json (O_EXCL) enqueues
        them and records the round there."""
        space, out = self.checked.space, self.options.out
        rounds = _rounds(out)
        if rounds is None or len(rounds) >= priors.ROUNDS:
            return  # a round being recorded, or the last one done
        if rounds and rounds[-1]["profile"] == rounds[-1]["context"]:
            return  # the last composition changed nothing
        context = rounds[-1]["strengths"] if rounds else priors.soup(space)
        # By profile: a baseline's strengths are only the nearest point of the space.
        done = {t.user_attrs.get("profile"): t.values for t in st.finished(self.study)}
        reference = done.get(space.profile(context))
        probed = {
            (block, model): done.get(space.profile(priors.probe(space, block, model, context)))
            for block in space.names
            for model in priors.models(space)
        }
        if reference is None or any(v is None for v in probed.values()):
            return
        number = len(rounds) + 1
        try:
            flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY
            descriptor = os.open(out / COMPOSED.format(number), flags)
        except FileExistsError:
            return  # another worker composes this round
        higher = [o.measure.higher for o in self.checked.objectives]
        choice = priors.compose(reference, probed, higher)
        seed = priors.composed(space, choice, context, number)
        record = {"context": space.profile(context), "choice": choice, "profile": seed.profile}
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            json.dump({**record, "strengths": seed.strengths}, handle)
        points = [seed]
        if seed.profile != record["context"] and number < priors.ROUNDS:
            points += priors.probes(space, seed.strengths, number + 1)
        for point in points:
            if point.profile not in done:  # e.g. a composition equal to a probe: scored
                attrs = {"baseline": point.name, "profile": point.profile, "family": point.family}
                self.study.enqueue_trial(point.strengths, user_attrs=attrs)

    def optimize(self) -> None:
        """Run trials until N are complete over every worker, or the time is up."""
        total = self.options.trials
        progress = Progress(total, len(st.finished(self.study)), self.options.quiet)

        def after(study: Any, trial: Any) -> None:
            st.requeue_stale(study)  # a worker killed since: its trial runs next, here
            if _composes(self.options):
                self.compose_blocks()
            progress.update(len(st.finished(study)))
            rebalance_threads()  # share the cores with workers that started since
            if len(st.finished(study)) >= total:
                study.stop()

        try:
            if len(st.finished(self.study)) < total:
                self.study.optimize(
                    self.objective,
                    n_trials=None,
                    timeout=self.options.time,
                    callbacks=[after],
                    gc_after_trial=False,
                )
        finally:
            progress.close()


def _rounds(out: Path) -> list[dict[str, Any]] | None:
    """`blocks`'s recorded rounds, in order; None while one is being written."""
    found = []
    while (path := out / COMPOSED.format(len(found) + 1)).is_file():
        try:
            found.append(json.loads(path.read_text(encoding="utf-8")))
        except ValueError:
            return None
    return found


def _loader(options: SuiteRun):
    def load(folder: Path):
        from eval.model_loading import load_model

        return load_model(
            folder, options.device, options.dtype, tokenizer=options.tokenizer, progress=False
        )

    return load


class Progress:
    """A progress bar over N trials (every worker's), with this worker's trials per minute."""

    def __init__(self, total: int, done: int, quiet: bool) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, initial=done, unit="trial", disable=quiet, desc="search")
        self.start, self.first = time.monotonic(), done
        self.mine = 0

    def update(self, done: int) -> None:
        """`done` trials are complete in the storage; this worker finished one more."""
        self.mine += 1
        minutes = (time.monotonic() - self.start) / 60
        self.bar.n = min(done, self.bar.total)
        self.bar.set_postfix_str(f"{self.mine / minutes:.1f} trials/min" if minutes else "")
        self.bar.refresh()

    def close(self) -> None:
        """Close the bar."""
        self.bar.close()
