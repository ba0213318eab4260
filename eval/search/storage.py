"""A search's trials in optuna's storage: what makes it resumable and shared by workers.

The storage is a journal file in the search's folder (`DIR/search.journal`, what optuna
recommends for several processes on one machine or a shared file system) or any database URL
optuna accepts (several machines). optuna-dashboard reads either, so a search can be watched
live: `optuna-dashboard DIR/search.journal`.

- The first worker creates the study, records the search's settings in it and enqueues the
  baselines; a later worker (or a rerun) loads it and must bring the same settings.
- A trial interrupted by a kill is run again: on a database its heartbeat stops, optuna fails it
  and `RetryHeartbeatStaleTrialCallback` enqueues it again; in a journal file (no heartbeat), each
  trial records its worker (host and process id), and a worker starting on that host fails and
  enqueues again every running trial whose process is gone.
- N is the total over every worker: a trial starts only while the finished trials and those
  running with a lower number are fewer than N; a trial past N is pruned and its worker stops.
  A trial cut short (`eval.search.pruning`: pruned, with the attribute `cut`) is finished: it
  counts toward N.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eval.errors import SuiteError

JOURNAL = "search.journal"
STUDY = "surgery-search"
SETTINGS = "surgery_search"  # the study's user attribute holding the search's settings
WORKER = "worker"  # each trial's user attribute: host:pid of the process running it
RETRY_OF = "retry_of"  # a retried trial's user attribute: the number of the trial it reruns
CUT = "cut"  # a pruned trial's user attribute when a budget or the frontier cut it short


def require_optuna() -> Any:
    """optuna, or a one-line error saying how to install it."""
    try:
        import optuna
    except ImportError:
        raise SuiteError(
            "surgery search needs optuna: pip install 'optuna>=5' (a dependency of "
            "checkpoint-surgery)"
        ) from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def worker_id() -> str:
    """This process as trials record it: `host:pid`."""
    return f"{socket.gethostname()}:{os.getpid()}"


def open_storage(folder: Path, url: str | None) -> Any:
    """The journal file in `folder`, or the database at `url` with heartbeats, retries and
    atomic trial starts (`ClaimingRDBStorage`)."""
    require_optuna()
    if url is None:
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

        path = str(folder / JOURNAL)
        # The open lock (O_EXCL) works where symbolic links do not (some network file systems).
        return JournalStorage(JournalFileBackend(path, lock_obj=JournalFileOpenLock(path)))
    from optuna.exceptions import ExperimentalWarning
    from optuna.storages import RetryHeartbeatStaleTrialCallback
    from sqlalchemy.exc import IntegrityError, OperationalError

    from eval.search.database import ClaimingRDBStorage

    def rdb() -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ExperimentalWarning)  # heartbeats: since optuna 2.8
            return ClaimingRDBStorage(
                url,
                heartbeat_interval=30,
                grace_period=120,
                heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=3),
            )

    for attempt in range(4):
        try:
            return rdb()
        except (IntegrityError, OperationalError):
            # Workers starting together on a new database race to create its tables (one
            # wins, the others fail to insert the schema's version): open it again.
            time.sleep(0.5 * (attempt + 1))
    return rdb()


@dataclass
class Opened:
    """A study opened by this worker: whether it created it (and must enqueue the baselines)."""

    study: Any
    created: bool


# The samplers `--sampler` names (each reads the budgets' constraints each trial sets).
SAMPLERS = ("tpe", "nsga2", "gp", "random")


def make_sampler(name: str, seed: int, trials: int) -> Any:
    """optuna's sampler `name`, seeded: a Gaussian process (log expected hypervolume
    improvement; needs torch and scipy; the default, which leads bench/bench_search_samplers.py
    at equal trials), multi-objective TPE, NSGA-II (a population of a fifth of the trials, 4 to
    50: about five generations), or random proposals."""
    optuna = require_optuna()
    samplers = optuna.samplers
    if name == "tpe":
        return samplers.TPESampler(seed=seed)
    if name == "nsga2":
        return samplers.NSGAIISampler(seed=seed, population_size=min(50, max(4, trials // 5)))
    if name == "gp":
        return samplers.GPSampler(seed=seed)
    if name == "random":
        return samplers.RandomSampler(seed=seed)
    raise SuiteError(f"--sampler {name}: use {', '.join(SAMPLERS)}")


def open_study(
    storage: Any,
    settings: dict[str, Any],
    directions: list[str],
    sampler_seed: int,
    sampler_name: str = "tpe",
    trials: int = 50,
) -> Opened:
    """Create the study with these settings, or load it and check that they match.

    The sampler (`make_sampler`: `sampler_name`, for a search of `trials` trials) is seeded
    with `sampler_seed` in the worker that creates the study, so one worker with one seed
    repeats a search; a worker that joins or resumes one mixes in the trials already stored and
    its process id, so that it does not replay the random proposals made before.

    Raises:
        SuiteError: the storage holds a search with other settings.
    """
    optuna = require_optuna()
    from optuna.exceptions import DuplicatedStudyError

    def sampler(seed: int):
        return make_sampler(sampler_name, seed, trials)

    try:
        study = optuna.create_study(
            storage=storage,
            study_name=STUDY,
            directions=directions,
            sampler=sampler(sampler_seed),
        )
        created = True
    except DuplicatedStudyError:
        created = False
    if not created:
        study = optuna.load_study(study_name=STUDY, storage=storage)
        found = _settings_of(study)
        if found != json.loads(json.dumps(settings)):
            raise SuiteError(f"the storage holds another search ({_difference(found, settings)})")
        salt = f"{sampler_seed}/{len(study.trials)}/{worker_id()}"
        study.sampler = sampler(int(hashlib.sha256(salt.encode()).hexdigest()[:8], 16))
        return Opened(study, created=False)
    study.set_user_attr(SETTINGS, settings)
    return Opened(study, created=True)


def _settings_of(study: Any, wait: float = 30.0) -> Any:
    """The settings the creating worker records just after creating the study (a worker that
    loads it in between waits for them)."""
    deadline = time.monotonic() + wait
    while True:
        found = study.user_attrs.get(SETTINGS)
        if found is not None or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def _difference(found: Any, wanted: dict[str, Any]) -> str:
    if not isinstance(found, dict):
        return "not made by surgery search"
    for key in sorted(set(found) | set(wanted)):
        if found.get(key) != wanted.get(key):
            return f"{key} is {json.dumps(found.get(key))} there, {json.dumps(wanted.get(key))} now"
    return "same settings"


def _alive(worker: str) -> bool | None:
    """Whether the process of a trial's worker runs: None when it ran on another host."""
    host, _, pid = str(worker).rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return None
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# A worker records itself in a trial right after optuna starts it: a running trial without a
# worker this old was killed in between.
UNCLAIMED_AFTER = 60.0


def _stale(trial: Any) -> bool:
    """Whether a running trial's worker is gone (on this host, or before it claimed it)."""
    worker = trial.user_attrs.get(WORKER)
    if worker is None:
        started = trial.datetime_start
        return started is not None and time.time() - started.timestamp() > UNCLAIMED_AFTER
    return _alive(worker) is False


def requeue_stale(study: Any) -> list[int]:
    """Fail and enqueue again each running trial whose worker process on this host is gone
    (killed; or killed before it recorded itself, a minute ago or more), once; returns their
    numbers."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    requeued = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if not _stale(trial):
            continue
        with contextlib.suppress(UpdateFinishedTrialError, RuntimeError):
            # Only the worker whose update lands enqueues it (two may find the same trial).
            if study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL):
                attrs = {k: v for k, v in trial.user_attrs.items() if k != WORKER}
                study.enqueue_trial(trial.params, user_attrs={**attrs, RETRY_OF: trial.number})
                requeued.append(trial.number)
    return requeued


def finished(study: Any) -> list[Any]:
    """The trials that count toward N, in number order: the complete ones and those cut short
    (pruned with the attribute `cut`; they have no values)."""
    from optuna.trial import TrialState

    states = (TrialState.COMPLETE, TrialState.PRUNED)
    return [t for t in study.get_trials(deepcopy=False, states=states) if _counts(t)]


def _counts(trial: Any) -> bool:
    """Whether a complete or pruned trial counts toward N (a trial past N is pruned uncut)."""
    return trial.state.name == "COMPLETE" or CUT in trial.user_attrs


def may_start(study: Any, number: int, total: int) -> bool:
    """Whether trial `number` fits in `total`: fewer than `total` trials are finished or running
    with a lower number (the running ones are counted as if they will finish)."""
    from optuna.trial import TrialState

    states = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
    ahead = [
        t
        for t in study.get_trials(deepcopy=False, states=states)
        if _counts(t) or (t.state == TrialState.RUNNING and t.number < number)
    ]
    return len(ahead) < total
