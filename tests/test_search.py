"""`surgery search`: the frontier of per-block interpolation profiles, reported on items the
search never saw (the world: tests/support/search_world.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from safetensors.torch import load_file

from cli import cli
from eval.search import storage as st
from eval.study import results as res
from eval.study.compare import compare, compare_runs
from eval.study.memory import prepare_suite, score_suite
from eval.study.runner import SuiteRun
from tests.support import search_world

BLOCKS = ["--blocks", "0:2,2:4"]
# TPE: today's frontier, and fast (the Gaussian process, the default, is tested on its own).
SEARCH = [*BLOCKS, "--step", "0.25", "--resamples", "200", "--sampler", "tpe", "-q"]
TRIALS = 16


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    return search_world.build(tmp_path_factory.mktemp("search_world"))


def _search(world, out: Path, *extra: str):
    argv = ["search", world["base"], world["trained"], "--suite", world["suite"], "-o", out]
    return CliRunner().invoke(cli, [*map(str, argv), *SEARCH, *extra])


@pytest.fixture(scope="module")
def searched(world, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("searched") / "search"
    result = _search(world, out, "--trials", str(TRIALS))
    assert result.exit_code == 0, result.output
    return out


def _frontier(folder: Path) -> dict:
    return json.loads((folder / "frontier.json").read_text())


def _search_half_run(world, profile: str, name: str):
    """A profile's blend scored on the search half, as a compare run."""
    from surgery.diagnostics.memory_blend import MemoryBlender

    options = SuiteRun(progress=False, half="search")
    prepared = prepare_suite(world["suite"], options, world["trained"])
    from eval.study.memory import SuiteScorer

    blender = MemoryBlender(world["base"], world["trained"], SuiteScorer(prepared).load)
    from surgery.engine.ops.interpolate import resolve_alphas
    from surgery.hub.resolve import open_input

    values, stack, modules = resolve_alphas(open_input(world["trained"]), profile, None, None)
    blender.set_alphas(values, blender.stack(stack.name) if stack else None, modules)
    return score_suite(blender.model, blender.tokenizer, prepared, name)


def test_the_frontier_keeps_the_learned_block_and_reverts_the_damaged_one(world, searched):
    """The ideal profile (M itself) is on the frontier, or a point no worse than it beyond
    noise on both axes (paired bootstrap on the search half); no baseline is."""
    document = _frontier(searched)
    assert document["trials"] == TRIALS
    ideal = _search_half_run(world, search_world.IDEAL, "ideal")
    frontier = [p for p in document["points"] if p["frontier"]]
    baselines = [p for p in document["points"] if p["baseline"]]
    assert {p["baseline"] for p in baselines} == {
        "trained", "reverted 1:3", "uniform 0.25", "uniform 0.5", "uniform 0.75",
    }  # fmt: skip

    def worse(point) -> list[bool]:
        """Per objective, whether the point is worse than the ideal beyond noise."""
        run = _search_half_run(world, point["profile"], "point")
        comparison = compare_runs([ideal, run], resamples=500, seed=0)
        rows = [
            r for r in comparison.rows
            if r["model"] == "point" and r["scope"] == "overall" and r["metric"] == "ppl"
        ]  # fmt: skip
        return [r["ci_low"] > 0 for r in rows]  # perplexities: higher is worse

    assert any(p["profile"] == search_world.IDEAL or not any(worse(p)) for p in frontier)
    assert all(any(worse(p)) for p in baselines)


def test_every_point_rebuilt_and_rescored_on_the_report_half_equals_the_report(
    world, searched, tmp_path
):
    """`surgery interpolate --alpha PROFILE` then `surgery eval --suite --half report` gives the
    recorded report scores; `surgery search DIR --write N` writes the same checkpoint."""
    document = _frontier(searched)
    runner = CliRunner()
    names = [o["name"] for o in document["objectives"]]
    for point in document["points"]:
        folder = tmp_path / f"point-{point['point']}"
        argv = ["interpolate", "--alpha", point["profile"], world["base"], world["trained"]]
        assert runner.invoke(cli, [*map(str, argv), str(folder), "-q"]).exit_code == 0
        scored = tmp_path / f"scored-{point['point']}"
        argv = ["eval", folder, "--suite", world["suite"], "-o", scored, "--half", "report", "-q"]
        assert runner.invoke(cli, list(map(str, argv))).exit_code == 0
        comparison = compare(searched / "report" / "base", [scored], resamples=10)
        for objective, name in zip(document["objectives"], names, strict=True):
            row = next(
                r
                for r in comparison.rows
                if r["model"] == res.read_results(scored).model.name
                and (r["task"], r["metric"], r["split"], r["scope"])
                == (objective["task"], objective["metric"], objective["split"], "overall")
            )
            assert row["value"] == point["report"][name]["value"], (point["profile"], name)
    first = document["points"][-1]["point"]
    result = runner.invoke(cli, ["search", str(searched), "--write", str(first), "-q"])
    assert result.exit_code == 0, result.output
    written, rebuilt = searched / f"point-{first}", tmp_path / f"point-{first}"
    assert (written / "surgery_recipe.json").is_file()
    for shard in sorted(rebuilt.glob("*.safetensors")):
        ours, theirs = load_file(written / shard.name), load_file(shard)
        assert all(ours[k].equal(theirs[k]) for k in theirs)


def test_the_same_seed_gives_the_same_frontier(world, searched, tmp_path):
    again = tmp_path / "again"
    assert _search(world, again, "--trials", str(TRIALS)).exit_code == 0
    assert _frontier(again)["points"] == _frontier(searched)["points"]


def test_the_frontier_reports_its_hypervolume_on_both_halves(searched):
    """Per trial on the search half, for the final frontier on the report half, each against
    the worst of BASE and TRAINED on that half (perplexities as logarithms); in report.md."""
    from eval.search.hypervolume import Frame

    document = _frontier(searched)
    entry, points = document["hypervolume"], document["points"]
    names = [o["name"] for o in document["objectives"] if o["optimized"]]
    higher = tuple(o["higher_is_better"] for o in document["objectives"] if o["optimized"])
    assert document["sampler"] == "tpe" and entry["logarithm"] == names  # two perplexities
    trained = next(p for p in points if p["baseline"] == "trained")
    references = document["references"]
    halves = {
        "search": (
            [references["base"]["search"][n] for n in names],
            [trained["search"][n] for n in names],
        ),
        "report": (
            [references["base"]["report"][n]["value"] for n in names],
            [references["trained"]["report"][n]["value"] for n in names],
        ),
    }
    volumes = {}
    for half, (base, expert) in halves.items():
        worst = [max(b, e) for b, e in zip(base, expert, strict=True)]  # lower is better
        assert list(entry[half]["reference"].values()) == worst
        frame = Frame(higher, (True, True), tuple(worst))
        values = [
            [p[half][n] if half == "search" else p[half][n]["value"] for n in names]
            for p in points
            if p["frontier"]
        ]
        volumes[half] = frame.volume(values)
    curve = entry["search"]["per_trial"]
    assert len(curve) == TRIALS and curve == sorted(curve)
    assert curve[-1] == pytest.approx(volumes["search"]) and curve[-1] > 0
    assert entry["report"]["frontier"] == pytest.approx(volumes["report"])
    assert volumes["report"] > 0
    report = (searched / "report.md").read_text()
    assert "## Hypervolume" in report and f"{entry['report']['frontier']:.4g}" in report
    assert f"{names[1]} {entry['report']['reference'][names[1]]:.4g}" in report


def test_the_sampler_option_names_optunas_samplers():
    import optuna

    kinds = {name: type(st.make_sampler(name, 0, 40)).__name__ for name in st.SAMPLERS}
    assert kinds == {
        "tpe": "TPESampler", "nsga2": "NSGAIISampler", "gp": "GPSampler",
        "random": "RandomSampler",
    }  # fmt: skip
    assert st.make_sampler("nsga2", 0, 40)._population_size == 8
    from eval.search.settings import SearchOptions

    assert SearchOptions().sampler == "tpe"  # the default: it leads bench_search_samplers.py --demo
    assert isinstance(st.make_sampler("tpe", 3, 40), optuna.samplers.TPESampler)


@pytest.mark.slow
@pytest.mark.parametrize("sampler", ["nsga2", "gp", "random"])
def test_every_sampler_runs_a_search_to_n_trials(world, tmp_path, sampler):
    out = tmp_path / sampler
    result = _search(world, out, "--trials", "12", "--sampler", sampler)
    assert result.exit_code == 0, result.output
    document = _frontier(out)
    assert document["trials"] == 12 and document["sampler"] == sampler
    assert len(document["hypervolume"]["search"]["per_trial"]) == 12
    assert any(p["frontier"] for p in document["points"])


def test_a_killed_search_resumes_to_n_trials(world, tmp_path, monkeypatch):
    """A worker killed in its 9th trial (its process gone: the trial still reads running; the
    worker's pid is one no process has) is
    resumed by the same command: the finished trials are kept, the killed one runs again, and
    the search ends with N trials."""
    out = tmp_path / "killed"
    from eval.search.pruning import Pruner

    original = Pruner.values

    class Killed(BaseException):
        """Stands for SIGKILL: nothing of the trial's ending runs."""

    def dies_in_the_ninth_trial(self, trial, profile):
        if trial.number == 8:
            raise Killed
        return original(self, trial, profile)

    monkeypatch.setattr(Pruner, "values", dies_in_the_ninth_trial)
    monkeypatch.setattr(st, "worker_id", lambda: f"{st.socket.gethostname()}:999999999")
    with pytest.raises(Killed):  # neither optuna nor the command line catch it
        _search(world, out, "--trials", "12")
    monkeypatch.undo()
    study = _study(out)
    states = [t.state.name for t in study.trials]
    assert len(st.finished(study)) == 8 and states[8] == "RUNNING"
    result = _search(world, out, "--trials", "12")
    assert result.exit_code == 0, result.output
    study = _study(out)
    complete = st.finished(study)
    assert len(complete) == 12 and _frontier(out)["trials"] == 12
    retried = [t for t in complete if t.user_attrs.get(st.RETRY_OF) == 8]
    assert len(retried) == 1 and retried[0].params == study.trials[8].params
    assert study.trials[8].state.name == "FAIL"


def _study(out: Path, url: str | None = None):
    import optuna

    return optuna.load_study(study_name=st.STUDY, storage=st.open_storage(out, url))


def test_two_workers_share_one_search(world, tmp_path):
    """Two workers on one storage finish N trials together: none lost, none repeated."""
    from eval.search.run import Searcher, SearchOptions, run_search

    out = tmp_path / "shared"
    options = SearchOptions(
        base=str(world["base"]),
        trained=str(world["trained"]),
        suite=world["suite"],
        out=out,
        blocks="0:2,2:4",
        step=0.25,
        trials=14,
        quiet=True,
        sampler="tpe",
    )
    errors: list[BaseException] = []
    ran: dict[int, int] = {}  # thread -> trials it scored
    original = Searcher.objective

    def counted(self, trial):
        try:
            return original(self, trial)
        finally:  # scored: complete, or cut short (a trial past N is neither)
            if "search" in trial.user_attrs or st.CUT in trial.user_attrs:
                ran[threading.get_ident()] = ran.get(threading.get_ident(), 0) + 1

    Searcher.objective = counted

    def work() -> None:
        try:
            run_search(options, SuiteRun(progress=False))
        except BaseException as error:  # reported below, in the test's thread
            errors.append(error)

    workers = [threading.Thread(target=work) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    Searcher.objective = original
    assert not errors
    assert len(ran) == 2 and sum(ran.values()) == 14, ran  # both worked, no trial twice
    study = _study(out)
    complete = st.finished(study)
    assert len(complete) == 14
    workers_seen = {t.user_attrs[st.WORKER] for t in complete}
    assert len(workers_seen) == 1  # one process; the trials' numbers tell the workers apart
    numbers = [t.number for t in complete]
    assert len(set(numbers)) == 14
    baselines = [t.user_attrs["baseline"] for t in complete if "baseline" in t.user_attrs]
    assert sorted(baselines) == sorted(set(baselines)) and len(baselines) == 5
    waiting = [t for t in study.trials if t.state.name in ("WAITING", "RUNNING")]
    assert not waiting


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--budget", "others chrf <= +5%"], "measure 'chrf': the suite has no such task"),
        (["--blocks", "0:2,1:4"], "overlap at layer 1"),
        (["--blocks", "0:2,2:9"], "outside the model's 4 layers"),
        (["--blocks", "0:2"], "no block covers layers 2:4"),
        (["--trials", "0"], "--trials must be at least 1"),
        (["--budget", "others ppl <= 5%"], "write +5% or -5%"),
    ],
)
def test_bad_input_is_one_line_before_any_model_loads(world, tmp_path, monkeypatch, extra, message):
    import eval.model_loading

    monkeypatch.setattr(eval.model_loading, "load_model", _no_model)
    out = tmp_path / "bad"
    argv = ["search", world["base"], world["trained"], "--suite", world["suite"], "-o", out]
    result = CliRunner().invoke(cli, [*map(str, argv), "-q", *extra])
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1 and message in result.output, result.output
    assert not out.exists()


def test_forgetting_needs_others_in_the_suite(world, tmp_path, monkeypatch):
    import eval.model_loading

    monkeypatch.setattr(eval.model_loading, "load_model", _no_model)
    suite = tmp_path / "suite.yml"
    text = world["suite"].read_text().replace("others: [eng_Latn]\n", "")
    suite.write_text(text.replace("root: .", f"root: {world['suite'].parent}"))
    out = tmp_path / "bad"
    argv = ["search", world["base"], world["trained"], "--suite", suite, "--out", out, "-q"]
    result = CliRunner().invoke(cli, list(map(str, argv)))
    assert result.exit_code == 2 and "forgetting needs others languages" in result.output
    assert not out.exists()


def _no_model(*args, **kwargs):
    raise AssertionError("a model was loaded")


def test_a_folder_of_something_else_is_refused(world, tmp_path):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    result = _search(world, out, "--trials", "6")
    assert result.exit_code == 2 and "holds no search" in result.output


@pytest.mark.slow
def test_a_search_killed_by_sigkill_resumes_to_n_trials(world, tmp_path):
    """The same as above with a real process and SIGKILL."""

    out = tmp_path / "sigkill"
    process = _process(world, out, "--trials", "40")
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and process.poll() is None:
            if (out / st.JOURNAL).is_file() and len(st.finished(_study(out))) >= 8:
                break
            time.sleep(0.5)
        assert process.poll() is None, "the search ended before it was killed"
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.wait()
    before = _study(out)
    killed = [t.number for t in before.trials if t.state.name == "RUNNING"]
    assert len(killed) <= 1
    # A loaded machine may finish a few more trials between the check and the kill.
    total = max(12, len(st.finished(before)) + 4)
    result = _search(world, out, "--trials", str(total))
    assert result.exit_code == 0, result.output
    study = _study(out)
    assert len(st.finished(study)) == total and _frontier(out)["trials"] == total
    for number in killed:
        assert study.trials[number].state.name == "FAIL"
        assert [t.user_attrs.get(st.RETRY_OF) for t in st.finished(study)].count(number) == 1


def _process(world, out: Path, *extra: str) -> subprocess.Popen:
    """`surgery search` in a process of its own (one thread: workers share the cores)."""
    argv = ["search", world["base"], world["trained"], "--suite", world["suite"], "-o", out]
    code = "import sys; from cli import main; sys.argv[0] = 'surgery'; main()"
    command = [sys.executable, "-c", code, *map(str, argv), *SEARCH, *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        command, env=env, cwd=Path(__file__).parents[1], stderr=subprocess.PIPE, text=True
    )


def _ran_once(study, total: int) -> list:
    """The complete trials: exactly `total`, numbers distinct, each baseline once, nothing left
    waiting or running."""
    complete = st.finished(study)
    assert len(complete) == total and len({t.number for t in complete}) == total
    baselines = [t.user_attrs["baseline"] for t in complete if "baseline" in t.user_attrs]
    assert sorted(baselines) == sorted({"trained", "reverted 1:3", *UNIFORM}), baselines
    assert not [t.number for t in study.trials if t.state.name in ("WAITING", "RUNNING")]
    return complete


# Two processes start enqueued trials at one instant, each as fast as it can.
_STARTER = """
import sys, time
from pathlib import Path
import optuna
from eval.search import storage as st
url, start = sys.argv[1], float(sys.argv[2])
study = optuna.load_study(study_name="race", storage=st.open_storage(Path("."), url))
while time.time() < start:
    pass
started = []
while (trial_id := study._pop_waiting_trial_id()) is not None:
    started.append(trial_id)
print(*started)
"""


def test_two_processes_never_start_one_enqueued_trial_twice(tmp_path):
    """On SQLite, optuna's own start reads a trial's state and writes it in two statements: two
    processes popping 200 enqueued trials at once start about 10 of them twice. Through
    `open_storage` each starts in one conditional update: every trial is started once."""
    import optuna

    url = f"sqlite:///{tmp_path / 'race.db'}"
    study = optuna.create_study(study_name="race", storage=st.open_storage(tmp_path, url))
    for x in range(200):
        study.enqueue_trial({"x": float(x)})
    start = time.time() + 5  # both have imported optuna by then
    argv = [sys.executable, "-c", _STARTER, url, str(start)]
    root = Path(__file__).parents[1]
    processes = [subprocess.Popen(argv, cwd=root, stdout=subprocess.PIPE, text=True) for _ in "ab"]
    started = [p.communicate(timeout=120)[0].split() for p in processes]
    assert all(p.returncode == 0 for p in processes)
    assert all(started), "one process started no trial: they did not race"
    assert sorted(map(int, started[0] + started[1])) == [t._trial_id for t in study.trials]
    assert {t.state.name for t in study.trials} == {"RUNNING"}
    assert all(t.datetime_start is not None for t in study.trials)


UNIFORM = ("uniform 0.25", "uniform 0.5", "uniform 0.75")
PROCESS_TRIALS = 16


@pytest.mark.slow  # two processes start, load and write the report each: about a minute
@pytest.mark.parametrize("storage", ["journal", "sqlite"])
def test_two_processes_share_one_search(world, tmp_path, storage):
    """Two `surgery search` processes on one journal file (or one SQLite database through
    optuna's RDB storage) finish N trials together: both work, none is lost or repeated, each
    baseline runs once, and the report holds all N."""
    out = tmp_path / "shared"
    url = f"sqlite:///{tmp_path / 'search.db'}" if storage == "sqlite" else None
    extra = ["--trials", str(PROCESS_TRIALS), *(["--storage", url] if url else [])]
    processes = [_process(world, out, *extra) for _ in range(2)]
    for process in processes:
        _, errors = process.communicate(timeout=600)
        assert process.returncode == 0, errors
    complete = _ran_once(_study(out, url), PROCESS_TRIALS)
    workers = {t.user_attrs[st.WORKER] for t in complete}
    assert workers == {f"{st.socket.gethostname()}:{p.pid}" for p in processes}
    assert _frontier(out)["trials"] == PROCESS_TRIALS


@pytest.mark.slow
def test_a_killed_process_trial_runs_again_in_the_other(world, tmp_path):
    """Two processes on one journal file; one is killed (SIGKILL) in a trial. The other fails
    that trial, runs it again (same strengths) and ends the search with N trials."""
    out = tmp_path / "killed"
    total = 24
    killed, survivor = (_process(world, out, "--trials", str(total)) for _ in range(2))
    victim = f"{st.socket.gethostname()}:{killed.pid}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and killed.poll() is None:
            if (out / st.JOURNAL).is_file():
                try:
                    study = _study(out)
                except KeyError:  # the journal is there, the study not yet
                    time.sleep(0.05)
                    continue
                running = [
                    t
                    for t in study.get_trials(deepcopy=False)
                    if t.state.name == "RUNNING" and t.user_attrs.get(st.WORKER) == victim
                ]
                if running and len(st.finished(study)) >= 6:
                    os.kill(killed.pid, signal.SIGKILL)
                    break
            time.sleep(0.05)
        assert killed.wait() == -signal.SIGKILL, killed.stderr.read()
        _, errors = survivor.communicate(timeout=600)
        assert survivor.returncode == 0, errors
    finally:
        for process in (killed, survivor):
            if process.poll() is None:
                process.kill()
    study = _study(out)
    lost = [t for t in study.trials if t.user_attrs.get(st.WORKER) == victim]
    lost = [t for t in lost if t.state.name == "FAIL"]
    assert len(lost) == 1, [(t.number, t.state.name) for t in study.trials]
    complete = _ran_once(study, total)
    retried = [t for t in complete if t.user_attrs.get(st.RETRY_OF) == lost[0].number]
    assert len(retried) == 1 and retried[0].params == lost[0].params
    assert retried[0].user_attrs[st.WORKER] == f"{st.socket.gethostname()}:{survivor.pid}"


# --- seed profiles (`eval.search.priors`) ----------------------------------------------------


def _localize(world, first: str, second: str, out: Path) -> Path:
    argv = ["localize", world[first], world[second], *BLOCKS]
    argv += ["--suite", world["suite"], "-o", out, "-q"]
    result = CliRunner().invoke(cli, list(map(str, argv)))
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def localized(world, tmp_path_factory) -> Path:
    return _localize(world, "base", "trained", tmp_path_factory.mktemp("loc") / "localize")


def test_localize_records_the_identity_of_its_inputs(world, localized):
    from surgery.diagnostics.localize import pair_identity
    from surgery.hub.resolve import open_input

    inputs = json.loads((localized / "localize.json").read_text())["config"]["inputs"]
    base, trained = open_input(world["base"]), open_input(world["trained"])
    assert inputs["identity"] == pair_identity(base, trained)
    assert inputs["identity"] != pair_identity(trained, base)
    assert inputs["num_layers"] == search_world.LAYERS


def test_localize_seeds_find_the_damaged_block_and_the_report_names_each_family(
    world, localized, tmp_path
):
    """In the world, reverting the last block helps both perplexities and reverting the first
    hurts them: `localize sign` is the ideal profile. Every seed runs once, first, and the
    report says which family each point came from (sampled points: none)."""
    out = tmp_path / "seeded"
    seeds = ["--seed-profiles", "lines", "--seed-profiles", "reverted"]
    seeds += ["--seed-profiles", f"localize {localized}"]
    result = _search(world, out, "--trials", "14", *seeds)
    assert result.exit_code == 0, result.output
    document = json.loads((out / "frontier.json").read_text())
    came = {p["profile"]: p["came_from"] for p in document["points"]}
    assert came[search_world.IDEAL] == "localize (localize sign)"
    families = [c.split(" ")[0] for c in came.values()]
    assert {"baseline", "lines", "localize"} <= set(families)
    # The band 1:3 of 4 at 0, 0.25, 0.5 is 0.5 or 0.75 in both blocks: the reverted and
    # uniform baselines hold them, so no `reverted` seed runs here.
    assert "reverted" not in families
    sampled = [p for p in document["points"] if p["baseline"] is None]
    assert all(p["came_from"] == "none" for p in sampled)
    names = [p["baseline"] for p in document["points"] if p["baseline"]]
    assert len(names) == len(set(names))
    report = (out / "report.md").read_text()
    assert "| came from |" in report and "localize (localize sign)" in report


def test_a_localize_run_of_another_pair_is_refused_before_any_model_loads(
    world, tmp_path, monkeypatch
):
    import eval.model_loading

    other = _localize(world, "base", "m", tmp_path / "other")
    monkeypatch.setattr(eval.model_loading, "load_model", _no_model)
    out = tmp_path / "refused"
    result = _search(world, out, "--trials", "8", "--seed-profiles", f"localize {other}")
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1, result.output
    assert "not this BASE and TRAINED" in result.output and str(world["m"]) in result.output
    assert not out.exists()
    result = _search(world, out, "--trials", "8", "--seed-profiles", f"localize {tmp_path}")
    assert result.exit_code == 2 and "no localize run there" in result.output
    assert not out.exists()


# --- sweep and localize --suite: the same scoring of a suite on a blend in memory -----------


def test_localize_suite_scores_a_reverted_block_as_eval_and_compare_do(world, tmp_path):
    runner = CliRunner()
    out = tmp_path / "localize"
    argv = ["localize", world["base"], world["trained"], "--blocks", "0:2,2:4"]
    argv += ["--suite", world["suite"], "-o", out, "-q"]
    result = runner.invoke(cli, list(map(str, argv)))
    assert result.exit_code == 0, result.output
    rows = {r["block"]: r for r in json.loads((out / "localize.json").read_text())["rows"]}
    # The damaged block reverted: both perplexities fall below TRAINED's (a negative recovery).
    assert rows["2:4"]["recovery/ppl/held_in/ppl"] < 0 < rows["0:2"]["recovery/ppl/held_in/ppl"]
    reverted, scored = tmp_path / "reverted", tmp_path / "scored"
    argv = ["revert", "--layers", "2:4", world["base"], world["trained"], reverted, "-q"]
    assert runner.invoke(cli, list(map(str, argv))).exit_code == 0
    argv = ["eval", reverted, "--suite", world["suite"], "-o", scored, "-q"]
    assert runner.invoke(cli, list(map(str, argv))).exit_code == 0
    argv = ["eval", world["base"], "--suite", world["suite"], "-o", tmp_path / "base", "-q"]
    assert runner.invoke(cli, list(map(str, argv))).exit_code == 0
    comparison = compare(tmp_path / "base", [scored], resamples=10)
    name = res.read_results(scored).model.name
    for split in ("held_in", "others"):
        row = next(
            r
            for r in comparison.rows
            if (r["model"], r["metric"], r["split"], r["scope"]) == (name, "ppl", split, "overall")
        )
        assert rows["2:4"][f"ppl/{split}/ppl"] == row["value"]


def test_sweep_suite_scores_base_and_trained_at_its_ends(world, tmp_path):
    from eval.options import ScoringOptions
    from eval.study.memory import SuiteScorer

    out = tmp_path / "sweep"
    argv = ["sweep", "--alphas", "0,1", world["base"], world["trained"], "-o", out, "--no-save"]
    argv += ["--suite", world["suite"], "--half", "report", "-q"]
    result = CliRunner().invoke(cli, list(map(str, argv)))
    assert result.exit_code == 0, result.output
    rows = json.loads((out / "sweep.json").read_text())["rows"]
    scorer = SuiteScorer.of(world["suite"], ScoringOptions(half="report"), world["trained"])
    for row, end in zip(rows, ("base", "trained"), strict=True):
        expected = scorer(*scorer.load(world[end]))
        assert {k: v for k, v in row.items() if k != "alpha"} == expected


def test_suite_and_tasks_do_not_mix_in_sweep_and_localize(world):
    for command in (["sweep", "--no-save"], ["localize", "--block-width", "2"]):
        argv = [
            *command,
            world["base"],
            world["trained"],
            *(["-o", "x"] if command[0] == "sweep" else []),
        ]
        argv += ["--suite", world["suite"], "-t", "copain"]
        result = CliRunner().invoke(cli, list(map(str, argv)))
        assert result.exit_code == 2 and "not both" in result.output
    result = CliRunner().invoke(
        cli, ["localize", str(world["base"]), str(world["trained"]), "--half", "search"]
    )
    assert result.exit_code == 2 and "--half goes with --suite" in result.output


# --- the pieces, without a model ----------------------------------------------------------


def test_blocks_cut_as_numpy_array_split_and_the_paper_band_scales():
    from eval.search.space import paper_band, parse_blocks

    assert parse_blocks("4", 34) == ((0, 9), (9, 18), (18, 26), (26, 34))
    assert parse_blocks("0:9,9:28,28:34", 34) == ((0, 9), (9, 28), (28, 34))
    assert paper_band(34) == (9, 28) and paper_band(6) == (2, 5)


def test_budgets_bound_a_value_a_change_or_a_relative_change():
    from eval.search.objectives import Measures, parse_budget
    from eval.study.suite import load_suite

    measures = Measures(load_suite(Path(__file__).parents[1] / "eval/study/suites/paper.yml"))
    relative = parse_budget(measures, "others ppl <= +5%")
    assert relative.violation(10.4, base=10.0) == pytest.approx(-0.1)
    assert relative.violation(10.6, base=10.0) == pytest.approx(0.1)
    change = parse_budget(measures, "held_in flores[eng_Latn-{lang}]/chrf >= +2")
    assert change.violation(32.5, base=30.0) == pytest.approx(-0.5)
    value = parse_budget(measures, "held_out belebele/acc_norm >= 40")
    assert value.violation(39.0, base=25.0) == pytest.approx(1.0)


def test_a_running_trial_nobody_claimed_for_a_minute_is_stale():
    import datetime
    from types import SimpleNamespace

    old = datetime.datetime.now() - datetime.timedelta(seconds=st.UNCLAIMED_AFTER + 5)
    assert st._stale(SimpleNamespace(user_attrs={}, datetime_start=old))
    assert not st._stale(SimpleNamespace(user_attrs={}, datetime_start=datetime.datetime.now()))
    alive = SimpleNamespace(user_attrs={st.WORKER: st.worker_id()}, datetime_start=old)
    assert not st._stale(alive)
