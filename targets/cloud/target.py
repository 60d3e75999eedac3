"""Cloud deployments as a tuning target: which instance family, size and node count to run
a recurring job on, for the lowest runtime or cost (CherryPick, NSDI'17; Scout).

Two adapters share one interface: the knobs and candidate deployments of a cloud catalog
(``knobs/cloud.py``: family, size, nodes; Scout's 69 deployments by default) and the
metrics ``runtime_s`` and ``cost_usd`` (nodes x hourly price x runtime). A deadline is the
outcome constraint ``runtime_s <= D`` of the study.

``cloud_replay`` answers from a table of runs (a CSV, one row per workload and
deployment)::

    [target]
    kind = "cloud_replay"
    table = "path/to/runs.csv"      # required: your measured runs
    workload = "spark_lr_bigdata"   # one of the table's workloads

The repository ships no measured table: Scout's measured runs (18 workloads; the reconstruction
``python -m bench.cloud`` reads from ``../shared/benchdata``) carry no license that lets them
ship. ``examples/cloud_runs.csv`` is a table the project makes from a performance model
(``examples/cloud_model.py``), for the example and the tests.

A deployment whose measured run failed or timed out is INFEASIBLE; one the table has no run
for is FAILED ("not measured"). The candidate list is the deployments measured for the
workload.

``cloud_launch`` runs the job for real, one deployment per trial, through the user's own
commands (argument lists, never a shell; placeholders ``{family}``, ``{size}``, ``{nodes}``
and ``{instance_type}``)::

    [target]
    kind = "cloud_launch"
    provision = ["./cluster.sh", "up", "{instance_type}", "{nodes}"]   # optional
    command = ["./cluster.sh", "run", "{instance_type}", "{nodes}"]
    teardown = ["./cluster.sh", "down"]                                # optional, always
    deadline_s = 3600     # the run is killed past it: INFEASIBLE
    timeout_s = 1800      # limit of provision and teardown: past it the trial FAILED

``command`` may print a JSON object with ``runtime_s`` and ``cost_usd`` (its last one on
stdout counts, as for the ``command`` target); missing ones are the run's wall time and the
catalog price times it. A launcher that fails (provision, or the run exiting non-zero) is a
FAILED trial, since it says nothing about the deployment; a run past ``deadline_s`` is
INFEASIBLE. ``teardown`` runs after every trial whose provisioning started, whatever
happened; if it fails the session stops, since machines may be left running.
"""

from __future__ import annotations

import csv
import math
import os
import time
from pathlib import Path
from typing import Any, ClassVar

from knobs.cloud import CloudCatalog, load_cloud_catalog
from targets.base import Target, full_config, option_directory, option_number
from targets.command.target import (
    MAX_TIMEOUT_S,
    argv_option,
    parse_metrics,
    placeholders,
    render,
    run_command,
    tail_text,
)
from tuner.errors import ConfigRejected, TargetError, TrialTimedOut, ValidationError
from tuner.space import Config, Knob

_COLUMNS = ("workload", "family", "size", "num_nodes", "runtime_s", "cost_usd", "completed")
#: How a table may say whether a run completed.
_FLAGS = {"1": True, "0": False, "true": True, "false": False}
METRICS = {
    "runtime_s": "s, wall time of the job on the deployment",
    "cost_usd": "USD, nodes x hourly on-demand price x runtime",
}
_PLACEHOLDERS = ("family", "size", "nodes", "instance_type")


class CloudTarget(Target):
    """What both cloud adapters share: the catalog's knobs, candidates and metrics."""

    def __init__(self, catalog: Any) -> None:
        self.catalog: CloudCatalog = load_cloud_catalog(catalog)
        self._config: Config | None = None

    def describe_knobs(self) -> tuple[Knob, ...]:
        return self.catalog.knobs()

    def describe_metrics(self) -> dict[str, str]:
        return dict(METRICS)

    def describe_candidates(self) -> tuple[Config, ...]:
        return self.catalog.candidates()

    def describe_candidate_features(self) -> tuple[dict[str, float], ...]:
        """Each deployment's totals: what a job sees of it (``CloudCatalog.resources``)."""
        return tuple(self.catalog.resources(c) for c in self.describe_candidates())

    def apply(self, config: Config) -> None:
        # what the catalog offers one value of is no knob: the default's, for every trial
        self._config = {**self.catalog.default,
                        **full_config(self.kind, self.describe_knobs(), config)}  # fmt: skip

    def restore(self) -> None:
        self._config = None

    def _deployment(self) -> tuple[Config, str]:
        if self._config is None:
            raise TargetError("measure() before apply()")
        config = self._config
        return config, f"{config['nodes']} x {config['family']}.{config['size']}"


class CloudReplayTarget(CloudTarget):
    """Answers each deployment with its run in a table of runs (see the module doc).

    Args:
        workload: Name of the workload to replay, one of the table's. Required.
        table: Path of the lookup CSV of runs, one row per workload and deployment. Required
            (``examples/cloud_runs.csv`` is a modelled one, ``examples/cloud_model.py``).
        catalog: Cloud catalog of instance types and prices: a shipped one by name
            (``knobs/instances/<name>.toml``) or the path of a catalog TOML file.
    """

    kind: ClassVar[str] = "cloud_replay"

    def __init__(
        self, *, workload: Any = None, table: Any = None, catalog: Any = "aws_2017"
    ) -> None:
        super().__init__(catalog)
        wanted = "the path of a CSV of runs with columns " + ", ".join(_COLUMNS)
        if table is None:
            raise ValidationError(
                "target.table",
                "is required: the repository ships no measured table (examples/cloud_runs.csv "
                "is a modelled one, made by examples/cloud_model.py)",
                wanted,
            )
        path = Path(table) if isinstance(table, str) else None
        if path is None or not path.is_file():
            raise ValidationError("target.table", f"{table!r} is not a file", wanted)
        self.runs = read_lookup(path)
        workloads = tuple(sorted(self.runs))
        if workload not in self.runs:
            raise ValidationError("target.workload", f"got {workload!r}", workloads)
        self.workload: str = workload
        catalogued = {_key(c) for c in self.catalog.candidates()}
        uncatalogued = sorted(k for k in self.runs[workload] if k not in catalogued)
        if uncatalogued:  # silently dropping them would tune over what is left
            types = sorted({f"{f}.{s}" for f, s, _ in uncatalogued})
            known = sorted({f"{i.family}.{i.size}" for i in self.catalog.instances})
            raise ValidationError(
                "target.table",
                f"{len(uncatalogued)} deployments of workload {workload!r} are not in the "
                f"catalog ({', '.join(f'{f}.{s} x {n}' for f, s, n in uncatalogued[:5])}"
                f"{', ...' if len(uncatalogued) > 5 else ''}; instance types "
                f"{', '.join(types)})",
                f"deployments of the catalog's instance types ({', '.join(known)}) and node "
                'counts; or a catalog that lists them: target.catalog = "path/to/catalog.toml"',
            )
        self._measured = dict(self.runs[workload])

    def describe_candidates(self) -> tuple[Config, ...]:
        return tuple(c for c in self.catalog.candidates() if _key(c) in self._measured)

    @property
    def noiseless(self) -> bool:
        """True: every deployment answers with its one measured run."""
        return True

    def measure(self) -> dict[str, float]:
        config, name = self._deployment()
        run = self._measured.get(_key(config))
        if run is None:
            raise TargetError(f"{self.workload} was not measured on {name}")
        if not run.completed:
            raise ConfigRejected(
                f"{self.workload} did not complete on {name} in the measured run "
                "(failed or timed out)"
            )
        return {"runtime_s": run.runtime_s, "cost_usd": run.cost_usd}


class CloudLaunchTarget(CloudTarget):
    """Provisions, runs and tears down each deployment with the user's commands.

    Args:
        command: Argument list that runs the job on the deployment, the program first;
            placeholders ``{family}``, ``{size}``, ``{nodes}``, ``{instance_type}``. Required.
        provision: Argument list run before each trial's job, same placeholders (default: none).
        teardown: Argument list run after every trial whose provisioning started, whatever
            happened, same placeholders (default: none).
        deadline_s: Seconds the job may run; past it the run is killed and the trial is
            INFEASIBLE. In ``(0, 604800]``.
        timeout_s: Seconds ``provision`` and ``teardown`` may each run; past it the trial
            FAILED. In ``(0, 604800]``.
        workdir: Existing directory the commands run in (default: the current directory).
        catalog: Cloud catalog of instance types and prices: a shipped one by name
            (``knobs/instances/<name>.toml``) or the path of a catalog TOML file.
    """

    kind: ClassVar[str] = "cloud_launch"

    def __init__(
        self,
        *,
        command: Any = None,
        provision: Any = None,
        teardown: Any = None,
        deadline_s: Any = 3600.0,
        timeout_s: Any = 1800.0,
        workdir: Any = None,
        catalog: Any = "aws_2017",
    ) -> None:
        super().__init__(catalog)
        self.command: list[str] = argv_option("command", command, required=True) or []
        self.provision = argv_option("provision", provision)
        self.teardown = argv_option("teardown", teardown)
        for name, argv in (
            ("command", self.command),
            ("provision", self.provision),
            ("teardown", self.teardown),
        ):
            for index, arg in enumerate(argv or ()):
                for placeholder in placeholders(arg, f"target.{name}[{index}]"):
                    if placeholder not in _PLACEHOLDERS:
                        raise ValidationError(
                            f"target.{name}[{index}]",
                            f"unknown placeholder {{{placeholder}}}",
                            [f"{{{p}}}" for p in _PLACEHOLDERS],
                        )
        self.deadline_s = option_number("deadline_s", deadline_s, 0.0, MAX_TIMEOUT_S, open_low=True)
        self.timeout_s = option_number("timeout_s", timeout_s, 0.0, MAX_TIMEOUT_S, open_low=True)
        self.workdir = (option_directory("workdir", workdir) or Path(".")).resolve()
        self._provisioned: dict[str, Any] | None = None

    def apply(self, config: Config) -> None:
        super().apply(config)
        values = self._values()
        if self.provision is None:
            return
        self._provisioned = values  # teardown runs from here on, whatever happens
        self._step("provision", self.provision, values)

    def measure(self) -> dict[str, float]:
        config, name = self._deployment()
        values = self._values()
        argv = render(self.command, values, "command")
        start = time.monotonic()
        try:
            done = run_command(argv, dict(os.environ), self.workdir, self.deadline_s)
        except TrialTimedOut:
            raise ConfigRejected(
                f"the job ran past the deadline ({self.deadline_s:g} s) on {name}; killed"
            ) from None
        wall = time.monotonic() - start
        if done.status != 0:
            tail = tail_text(done.stderr)
            raise TargetError(f"the launcher failed on {name}: exit status {done.status}: {tail}")
        printed = any(line.startswith("{") for line in done.stdout.splitlines())
        reported = parse_metrics(done.stdout, (), "stdout") if printed else {}
        runtime = reported.get("runtime_s", wall)
        if runtime > self.deadline_s:
            raise ConfigRejected(
                f"the job took {runtime:g} s on {name}, past the deadline ({self.deadline_s:g} s)"
            )
        cost = reported.get("cost_usd", self.catalog.cost_usd(config, runtime))
        return {**reported, "runtime_s": runtime, "cost_usd": cost}

    def restore(self) -> None:
        values, self._provisioned = self._provisioned, None
        super().restore()
        if values is not None and self.teardown is not None:
            self._step("teardown", self.teardown, values)

    def _values(self) -> dict[str, Any]:
        config, _ = self._deployment()
        return {**config, "instance_type": self.catalog.instance(config).name}

    def _step(self, what: str, template: list[str], values: dict[str, Any]) -> None:
        argv = render(template, values, what)
        try:
            done = run_command(argv, dict(os.environ), self.workdir, self.timeout_s)
        except TargetError as exc:  # TrialTimedOut included: the launcher is at fault
            raise TargetError(f"{what}: {exc}") from None
        if done.status != 0:
            raise TargetError(
                f"{what} {argv[0]!r} failed: exit status {done.status}: {tail_text(done.stderr)}"
            )


class MeasuredRun:
    __slots__ = ("completed", "cost_usd", "runtime_s")

    def __init__(self, runtime_s: float, cost_usd: float, completed: bool) -> None:
        self.runtime_s, self.cost_usd, self.completed = runtime_s, cost_usd, completed


def read_lookup(path: Path) -> dict[str, dict[tuple[str, str, int], MeasuredRun]]:
    """Workload -> (family, size, nodes) -> measured run, from the Scout/bbo-arena lookup CSV.

    Raises:
        ValidationError: A column is missing or a value is not a number (``target.table``).
    """
    out: dict[str, dict[tuple[str, str, int], MeasuredRun]] = {}
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in _COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise ValidationError("target.table", f"{path} has no column {missing[0]!r}", _COLUMNS)
        for line, row in enumerate(reader, start=2):
            done = str(row["completed"]).strip().lower()
            if done not in _FLAGS:
                raise ValidationError(
                    "target.table", f"{path} line {line}: completed is {row['completed']!r}",
                    sorted(_FLAGS),
                )  # fmt: skip
            try:
                key = (row["family"], row["size"], int(row["num_nodes"]))
                run = MeasuredRun(float(row["runtime_s"]), float(row["cost_usd"]), _FLAGS[done])
            except (ValueError, TypeError) as exc:  # TypeError: a short row (a None field)
                raise ValidationError("target.table", f"{path} line {line}: {exc}") from None
            if not (math.isfinite(run.runtime_s) and math.isfinite(run.cost_usd)):
                raise ValidationError("target.table", f"{path} line {line}: not a finite number")
            out.setdefault(row["workload"], {})[key] = run
    return out


def _key(config: Config) -> tuple[str, str, int]:
    return (str(config["family"]), str(config["size"]), int(config["nodes"]))
