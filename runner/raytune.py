"""Scale-out on Ray Tune: a ``Searcher`` backed by a tuner server, and ``tuner ray``.

Ray runs the trials, in parallel, on as many machines as its cluster has; the tuner server
keeps the study and proposes every configuration. ``TunerSearch`` is the bridge, after OSS
Vizier's ``VizierSearch`` (``vizier/_src/raytune/vizier_search.py``):

* ``suggest(trial_id)`` asks the server for one trial with ``client_id = "ray:<trial_id>"``,
  so a retried suggestion for the same Ray trial gets the same configuration back;
* ``on_trial_result`` (an intermediate report) renews the trial's lease;
* ``on_trial_complete`` reports the metrics (COMPLETED), the target's own verdict when the
  trainable reported one (``tuner_status`` and ``tuner_reason`` keys: INFEASIBLE,
  TIMED_OUT, ...), or FAILED when the trial raised;
* ``save`` / ``restore`` keep only the server address, the study name and the Ray trial id
  -> tuner trial id mapping: the server holds everything else.

``run_ray`` is what ``tuner ray CONFIG`` runs: the config's target, shipped to each Ray
trial (set up, measured once, restored there), with up to ``parallel`` trials at once. The
target must tolerate that (a program measured in its own process, a replayed table); one
database or one GPU measured by several trials at once measures contention, not the knobs.
"""

from __future__ import annotations

import contextlib
import os
import pickle
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ray import tune
from ray.tune.search import Searcher

from server.client import TunerClient
from targets.base import Target
from targets.raytrial import REASON_KEY, STATUS_KEY, measure
from tuner.errors import StateError, TunerError
from tuner.study import Goal, StudySpec
from tuner.trial import TrialStatus


class TunerSearch(Searcher):  # type: ignore[misc]
    """Ray Tune searcher whose suggestions come from a tuner server.

    Args:
        server: ``host:port`` of a running tuner server.
        study: The study to run; created on the server if it does not exist, loaded if it
            does (with the same spec). Its first objective is Ray's metric.
        tls_ca: PEM certificate to trust, for a server with TLS.
        token: Bearer token, for a server that requires one.
    """

    def __init__(
        self,
        server: str,
        study: StudySpec,
        tls_ca: bytes | None = None,
        token: str | None = None,
    ) -> None:
        objective = study.objectives[0]
        super().__init__(
            metric=objective.name, mode="max" if objective.goal is Goal.MAXIMIZE else "min"
        )
        self.server, self.study = server, study.name
        self._tls_ca, self._token = tls_ca, token
        self._connection: TunerClient | None = None
        self._client.create_study(study)
        self._metrics = study.metric_names
        self._ids: dict[str, int] = {}

    @property
    def _client(self) -> TunerClient:
        """The connection, opened on first use (Ray pickles searchers; channels do not)."""
        if self._connection is None:
            self._connection = TunerClient(self.server, tls_ca=self._tls_ca, token=self._token)
        return self._connection

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_connection": None}

    def set_search_properties(
        self, metric: str | None, mode: str | None, config: Mapping[str, Any], **spec: Any
    ) -> bool:
        """The study defines the space; Ray's metric and mode must agree with its objective."""
        return (metric in (None, self.metric)) and (mode in (None, self.mode))

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        [trial] = self._client.suggest_trials(self.study, 1, client_id=f"ray:{trial_id}")
        self._ids[trial_id] = trial.id
        return dict(trial.config)

    def on_trial_result(self, trial_id: str, result: Mapping[str, Any]) -> None:
        tuner_id = self._ids.get(trial_id)
        if tuner_id is None:
            return
        # expired or finished: the completion is still stored (as a late one)
        with contextlib.suppress(StateError):
            self._client.heartbeat(self.study, tuner_id, f"ray:{trial_id}")

    def on_trial_complete(
        self, trial_id: str, result: Mapping[str, Any] | None = None, error: bool = False
    ) -> None:
        tuner_id = self._ids.pop(trial_id, None)
        if tuner_id is None:
            return
        status, reason, metrics = outcome_of(result, error, self._metrics, trial_id)
        self._client.complete_trial(
            self.study, tuner_id, metrics, status, reason, client_id=f"ray:{trial_id}"
        )

    def save(self, checkpoint_path: str) -> None:
        state = {"server": self.server, "study": self.study, "ids": dict(self._ids)}
        Path(checkpoint_path).write_bytes(pickle.dumps(state))

    def restore(self, checkpoint_path: str) -> None:
        state = pickle.loads(Path(checkpoint_path).read_bytes())
        self.close()
        self.server, self.study, self._ids = state["server"], state["study"], state["ids"]
        self._metrics = self._client.get_study(self.study).spec.metric_names

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def outcome_of(
    result: Mapping[str, Any] | None, error: bool, metrics: tuple[str, ...], trial_id: str
) -> tuple[TrialStatus, str, dict[str, float]]:
    """What to report for a finished Ray trial: status, reason, metrics."""
    if error or result is None:
        return TrialStatus.FAILED, f"Ray trial {trial_id} raised an error (see Ray's log)", {}
    found = {m: float(result[m]) for m in metrics if isinstance(result.get(m), int | float)}
    status = TrialStatus(str(result.get(STATUS_KEY, TrialStatus.COMPLETED.value)))
    reason = str(result.get(REASON_KEY, ""))
    missing = [m for m in metrics if m not in found]
    if status is TrialStatus.COMPLETED and missing:
        return TrialStatus.FAILED, f"Ray trial {trial_id} reported no {missing[0]!r}", found
    return status, reason, found


def run_ray(
    server: str,
    study: StudySpec,
    target: Target,
    trials: int,
    parallel: int,
    tls_ca: bytes | None = None,
    token: str | None = None,
    storage: Path | None = None,
) -> None:
    """Run ``trials`` trials of ``study`` on Ray, ``parallel`` at a time.

    Ray's own trial folders go under ``storage`` (default: Ray's, ``~/ray_results``).

    Raises:
        TunerError: Ray could not run the trials (a trial's own failure is FAILED instead).
    """
    search = TunerSearch(server, study, tls_ca=tls_ca, token=token)
    try:
        with local_ray(parallel):
            tuner = tune.Tuner(
                tune.with_parameters(measure, target=target, cwd=os.getcwd()),
                tune_config=tune.TuneConfig(
                    search_alg=search, num_samples=trials, max_concurrent_trials=parallel
                ),
                run_config=tune.RunConfig(
                    verbose=0, storage_path=str(storage.resolve()) if storage else None
                ),
            )
            results = tuner.fit()
        if results.num_terminated == 0 and trials > 0:
            raise TunerError(f"Ray ran none of the {trials} trials")
    finally:
        search.close()


@contextlib.contextmanager
def local_ray(cpus: int) -> Iterator[None]:
    """A local Ray instance with ``cpus`` CPUs for the block, unless Ray already runs.

    Start it before any gRPC server of this process: Ray forks its daemons, and forking
    while gRPC's threads run kept the raylet from registering in tests.
    """
    import ray

    if ray.is_initialized():
        yield
        return
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
