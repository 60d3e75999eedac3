"""PostgreSQL target: tune a private server's configuration under a pgbench workload.

``setup()`` creates a throwaway cluster in a temporary directory (``initdb``, Unix socket
only, run as the ``postgres`` OS user when this process is root; see
``targets.db.postgres.cluster``), starts it and loads the pgbench tables at ``scale``. The one
server serves the whole session; each trial reconfigures it:

* ``apply()`` writes every tuned knob into ``tuner.conf`` (included last by
  ``postgresql.conf``), in base units (``targets.db.postgres.host_knobs.conf_line``). The server is
  restarted only when a restart-only knob (catalog ``restart = true``, or context
  ``postmaster`` in ``pg_settings``) needs a value other than the running one; otherwise it
  reloads, and ``apply()`` waits until it has. Then every knob is read back from
  ``pg_settings``: a value that is not in effect, or still ``pending_restart``, rejects the
  configuration, as does a server that will not start with it. Both are INFEASIBLE, with
  the server log's error lines as the reason.
* ``measure()`` runs a pgbench warm-up, then the measured window with a per-transaction
  log (``targets.db.postgres.pgbench``): ``tps``, ``latency_avg_ms``, ``p50_ms``, ``p95_ms``,
  ``p99_ms``. A run that fails while the server logs errors or dies (too few connections,
  out of memory, a crash) is the configuration's fault (INFEASIBLE); any other pgbench
  failure is FAILED.
* ``restore()`` empties ``tuner.conf`` (the untuned install) and reloads, or starts the
  server again when the trial left it down; then it truncates ``pgbench_history`` and takes
  a checkpoint, so the next trial inherits neither this one's rows nor its dirty pages.
  Restart-only values the trial set stay in effect until the next restart, which the next
  ``apply()`` makes only if it needs other values: a second restart per trial would buy
  nothing, since every trial's configuration is applied in full and verified.
* ``close()`` stops the server and removes the directory; so do an exception, a SIGTERM
  (with ``targets.host.signals.terminate_on_sigterm``) and, as a last resort, ``atexit``.

A restart empties the buffer cache and a reload does not, so the warm-up (``warmup_s``)
is what makes trials comparable; short windows on a small machine are noisy (see
``shared/reference/llamatune_db.md`` section 5.2).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from knobs.loader import load_catalog, select_knobs
from targets.base import (
    Target,
    full_config,
    option_directory,
    option_int,
    option_names_list,
)
from targets.db.postgres.cluster import (
    START_TIMEOUT_S,
    Cluster,
    Setting,
    probe_settings,
)
from targets.db.postgres.host_knobs import conf_line, host_facts, resolve_knobs, same
from targets.db.postgres.pgbench import (
    METRICS,
    SCRIPTS,
    Workload,
    WorkloadResultError,
    parse_progress,
    parse_summary,
    read_latencies,
    summarize,
)
from targets.db.postgres.tools import find_tools
from tuner.errors import ConfigRejected, StateError, TargetError, ValidationError
from tuner.space import Config, Knob

_RUN_MARGIN_S = 120  # how long a timed pgbench run may overrun before it is killed


class PostgresTarget(Target):
    """A private PostgreSQL server under a pgbench workload.

    Args:
        scale: pgbench scale factor (100,000 accounts, about 16 MB, per unit).
        workload: pgbench built-in script: ``tpcb-like``, ``simple-update`` or
            ``select-only``.
        clients: Concurrent pgbench connections (``-c``).
        threads: pgbench worker threads (``-j``), at most ``clients``; default
            ``min(clients, CPUs)``.
        warmup_s: Seconds of unrecorded workload before each measurement (0: none).
        measure_s: Seconds of measured workload per trial.
        seed: pgbench's ``--random-seed``, so every trial draws the same keys.
        windows: Windows a watched measurement is reported in (``Target.window``):
            pgbench's ``--progress`` every ``max(1, measure_s // windows)`` seconds.
        workdir: Parent directory of the cluster's temporary directory (default: the
            system's); the ``postgres`` user must be able to enter it when running as root.
        knobs: Catalog names of the knobs to tune (default: the whole catalog).
    """

    kind = "postgres"

    def __init__(
        self,
        *,
        scale: int = 10,
        workload: str = "tpcb-like",
        clients: int = 4,
        threads: int | None = None,
        warmup_s: int = 5,
        measure_s: int = 20,
        seed: int = 0,
        windows: int = 10,
        workdir: str | Path | None = None,
        knobs: list[str] | None = None,
    ) -> None:
        self.scale = option_int("scale", scale, 1, 100_000)
        self.windows = option_int("windows", windows, 1, 1000)
        if workload not in SCRIPTS:
            raise ValidationError("target.workload", f"got {workload!r}", SCRIPTS)
        self.clients = option_int("clients", clients, 1, 10_000)
        if threads is None:
            threads = min(self.clients, os.cpu_count() or 1)
        self.threads = option_int("threads", threads, 1, self.clients)
        self.warmup_s = option_int("warmup_s", warmup_s, 0, 3600)
        self.measure_s = option_int("measure_s", measure_s, 1, 3600)
        self.workload = Workload(
            workload, self.clients, self.threads, option_int("seed", seed, 0, 2**31 - 1)
        )
        self.workdir = option_directory("workdir", workdir)
        names = option_names_list("knobs", knobs)
        self._selected = select_knobs(self._catalog(), names, "target.knobs")
        self._explicit = names is not None
        self._knobs: tuple[Knob, ...] | None = None
        self._cluster: Cluster | None = None
        self._settings: dict[str, Setting] = {}
        self._applied = False
        self._log_offset = 0

    # -- contract ----------------------------------------------------------------------
    def describe_knobs(self) -> tuple[Knob, ...]:
        """The selected catalog knobs with this server's defaults and this host's ranges.

        Before ``setup()`` the defaults come from a probe cluster, made and removed once.
        """
        if self._knobs is None:
            settings = self._settings or probe_settings(find_tools(), self.workdir)
            host = host_facts(self.clients)
            self._knobs = resolve_knobs(self._selected, settings, host, self._explicit)
        return self._knobs

    def describe_metrics(self) -> dict[str, str]:
        return dict(METRICS)

    def setup(self) -> None:
        """Create and start the cluster and load the pgbench tables (once)."""
        if self._cluster is not None:
            return
        self._cluster = cluster = Cluster(find_tools(), self.workdir)
        cluster.create()
        try:
            cluster.start()
        except ConfigRejected as exc:
            raise TargetError(f"a fresh PostgreSQL cluster did not start: {exc}") from exc
        cluster.run(
            [cluster.tools.path("pgbench"), *self.workload.init_args(self.scale)],
            what=f"pgbench -i -s {self.scale}",
            timeout=600 + 10 * self.scale,
        )
        cluster.sql("checkpoint")
        self._settings = cluster.settings()
        self.describe_knobs()

    def measurement_window(self) -> tuple[float, float] | None:
        return (float(self.warmup_s), float(self.measure_s))

    def set_measurement_window(self, warmup_s: float, measure_s: float) -> None:
        """pgbench runs whole seconds: both are rounded up."""
        self.warmup_s = option_int("warmup_s", math.ceil(warmup_s), 0, 3600)
        self.measure_s = option_int("measure_s", math.ceil(measure_s), 1, 3600)

    def apply(self, config: Config) -> None:
        """Write the configuration, reload or restart, and check every value took effect."""
        cluster = self._require_cluster("apply")
        if self._applied:
            raise StateError("apply() called again before restore()")
        values = full_config("postgres", self.describe_knobs(), config)
        self._applied = True
        self._log_offset = cluster.log_offset()
        cluster.write_conf([conf_line(n, v, self._settings[n]) for n, v in values.items()])
        if not cluster.running or self._needs_restart(values):
            cluster.restart()
        else:
            cluster.reload()
        settings = cluster.settings()
        if any(settings[name].pending_restart for name in values):
            cluster.restart()  # the catalog missed a restart-only knob; the server knows
            settings = cluster.settings()
        self._settings = settings
        self._verify(values)

    def measure(self) -> dict[str, float]:
        """Warm up, then run the measured pgbench window on the applied configuration."""
        cluster = self._require_cluster("measure")
        if not self._applied:
            raise StateError("measure() before apply()")
        if self.warmup_s:
            self._pgbench(self.warmup_s, None)
        assert cluster.root is not None
        prefix = cluster.root / "pgbench_log"
        read_latencies(prefix)  # removes the logs of a run that failed
        windows: list[dict[str, float]] = []
        stdout = self._pgbench(self.measure_s, prefix, windows if self.watched else None)
        latencies = read_latencies(prefix)
        if stdout is None:  # stopped early: the windows' means, the logged percentiles
            return _partial(windows, latencies)
        try:
            tps, latency_avg = parse_summary(stdout)
            return summarize(tps, latency_avg, latencies)
        except WorkloadResultError as exc:
            excerpt = cluster.log_excerpt(self._log_offset)
            raise ConfigRejected(f"{exc}; server log: {excerpt}") from exc

    def restore(self) -> None:
        """Back to the untuned configuration file and a fresh history table; safe to repeat."""
        cluster = self._cluster
        if not self._applied or cluster is None or cluster.root is None:
            return
        self._applied = False
        cluster.write_conf([])
        if cluster.running and cluster.wait_ready(START_TIMEOUT_S):
            cluster.reload()
        else:
            try:
                cluster.stop()
                cluster.start()
            except ConfigRejected as exc:
                raise TargetError(
                    f"PostgreSQL did not start again with the default configuration: {exc}"
                ) from exc
        cluster.sql("truncate pgbench_history")
        cluster.sql("checkpoint")  # the next trial does not inherit this one's dirty pages
        self._settings = cluster.settings()

    def close(self) -> None:
        """Stop the server and remove the cluster's directory; safe to repeat."""
        cluster, self._cluster = self._cluster, None
        self._applied = False
        if cluster is not None:
            cluster.destroy()

    # -- inspection --------------------------------------------------------------------
    @property
    def directory(self) -> Path | None:
        """The cluster's temporary directory while the target is set up."""
        return None if self._cluster is None else self._cluster.root

    @property
    def server_pid(self) -> int | None:
        """The postmaster's process id while the server runs."""
        return None if self._cluster is None else self._cluster.pid

    def current_settings(self) -> dict[str, Setting]:
        """Every ``pg_settings`` row, by name, read from the server now."""
        return self._require_cluster("current_settings").settings()

    def sql(self, query: str) -> list[list[str]]:
        """Rows of ``query`` run on the server as its superuser (for checks and tests)."""
        return self._require_cluster("sql").sql(query)

    # -- helpers -----------------------------------------------------------------------
    def _catalog(self) -> tuple[Knob, ...]:
        return load_catalog("postgres")

    def _require_cluster(self, what: str) -> Cluster:
        if self._cluster is None or self._cluster.root is None:
            raise StateError(f"{what}() before setup(): use the postgres target in a with block")
        return self._cluster

    def _needs_restart(self, values: Config) -> bool:
        knobs = {k.name: k for k in self.describe_knobs()}
        return any(
            (knobs[name].restart or self._settings[name].context == "postmaster")
            and not same(name, value, self._settings)
            for name, value in values.items()
        )

    def _verify(self, values: Config) -> None:
        problems = []
        for name, value in values.items():
            row = self._settings[name]
            if row.pending_restart:
                problems.append(f"{name} = {value!r} is still pending a restart")
            elif not same(name, value, self._settings):
                shown = f"{row.setting}{' ' + row.unit if row.unit else ''}"
                problems.append(f"{name}: requested {value!r}, the server shows {shown}")
        if problems:
            assert self._cluster is not None
            raise ConfigRejected(
                "PostgreSQL did not take the configuration: "
                + "; ".join(problems)
                + "; server log: "
                + self._cluster.log_excerpt(self._log_offset)
            )

    def _pgbench(
        self, seconds: int, log_prefix: Path | None, windows: list[dict[str, float]] | None = None
    ) -> str | None:
        """Run pgbench for ``seconds`` and return its report; a failure is the
        configuration's if the server says so. With ``windows``, its progress lines are the
        measurement's windows (``Target.window``), collected there; None when one stopped
        the run."""
        cluster = self._require_cluster("measure")
        offset = cluster.log_offset()
        every = max(1, seconds // self.windows) if windows is not None else 0
        args = [cluster.tools.path("pgbench"), *self.workload.run_args(seconds, log_prefix, every)]
        timeout = seconds + _RUN_MARGIN_S
        if windows is None:
            done = cluster.run(args, what="pgbench", timeout=timeout, check=False)
            status, stdout, stderr = done.returncode, done.stdout, done.stderr
        else:

            def on_line(line: str) -> bool:
                window = parse_progress(line)
                if window is None:
                    return False
                windows.append(window)
                return self.window(window)

            followed, stdout, stderr = cluster.follow(
                args, on_line, what="pgbench", timeout=timeout
            )
            if followed is None:
                return None
            status = followed
        if status == 0:
            return stdout
        output = " ".join((stderr.strip() or stdout.strip())[-600:].split())
        problems = cluster.log_problems(offset)
        if problems or not cluster.running:
            raise ConfigRejected(
                f"pgbench failed (exit status {status}): {output}; server log: "
                + cluster.log_excerpt(offset)
            )
        raise TargetError(f"pgbench failed (exit status {status}): {output}")


def _partial(windows: list[dict[str, float]], latencies_us: list[int]) -> dict[str, float]:
    """The metrics of a run stopped early: the windows' mean tps and latency, and the
    percentiles of the transactions it logged (when pgbench wrote any)."""
    if not windows:
        raise TargetError("pgbench was stopped before its first progress line")
    out = {
        "tps": sum(w["tps"] for w in windows) / len(windows),
        "latency_avg_ms": sum(w["latency_avg_ms"] for w in windows) / len(windows),
    }
    if latencies_us:
        logged = summarize(out["tps"], out["latency_avg_ms"], latencies_us)
        out.update({k: logged[k] for k in ("p50_ms", "p95_ms", "p99_ms")})
    return out
