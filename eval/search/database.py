"""optuna's database storage, with trials started by one statement.

optuna starts an enqueued trial by reading that it waits and then writing that it runs. On
SQLite, which takes no row lock, two workers can both read it waiting and both run it (optuna
issue 4002): one of them then fails to record its result. Here the start is one conditional
UPDATE, which every database applies atomically: only the worker whose statement changed the
row runs the trial.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from optuna.storages import RDBStorage
from optuna.storages._rdb import models
from optuna.storages._rdb.storage import _create_scoped_session
from optuna.trial import TrialState
from sqlalchemy import update


class ClaimingRDBStorage(RDBStorage):
    """`RDBStorage` whose move from waiting to running is atomic on every database."""

    def set_trial_state_values(
        self, trial_id: int, state: TrialState, values: Sequence[float] | None = None
    ) -> bool:
        """As `RDBStorage`'s; a start returns False unless this call moved the trial from
        waiting to running (another worker started it, or it is finished)."""
        if state != TrialState.RUNNING or values is not None:
            return super().set_trial_state_values(trial_id, state, values)
        row = models.TrialModel
        claim = (
            update(row)
            .where(row.trial_id == trial_id, row.state == TrialState.WAITING)
            .values({row.state: TrialState.RUNNING})
            .execution_options(synchronize_session=False)  # the session holds no trial rows
        )
        with _create_scoped_session(self.scoped_session) as session:
            claimed = session.execute(claim).rowcount == 1
            if claimed:  # in the same transaction; the model converts the time as optuna does
                row.find_or_raise_by_id(trial_id, session).datetime_start = datetime.now()
        return claimed
