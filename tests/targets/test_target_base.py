"""Tests for the target contract (targets.base) and SIGTERM handling (targets.host.signals)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from targets.base import (
    Target,
    TrialOutcome,
    option_directory,
    option_int,
    option_names,
    option_names_list,
    option_number,
)
from targets.host.signals import SIGTERM_EXIT_STATUS, terminate_on_sigterm
from tuner.errors import ConfigRejected, TargetError, ValidationError
from tuner.space import BoolKnob, Config, IntKnob, Knob
from tuner.trial import TrialStatus


class RecordingTarget(Target):
    """A target whose steps are recorded and can be told to fail."""

    kind = "recording"

    def __init__(self, *, fail_in: str = "", error: BaseException | None = None) -> None:
        self.fail_in = fail_in
        self.error = error
        self.calls: list[str] = []

    def _step(self, name: str) -> None:
        self.calls.append(name)
        if name == self.fail_in and self.error is not None:
            raise self.error

    def setup(self) -> None:
        self._step("setup")

    def close(self) -> None:
        self._step("close")

    def describe_knobs(self) -> tuple[Knob, ...]:
        return (IntKnob("threads", low=1, high=8, default=2), BoolKnob("turbo", default=False))

    def describe_metrics(self) -> dict[str, str]:
        return {"tps": "transactions per second"}

    def apply(self, config: Config) -> None:
        self._step("apply")

    def measure(self) -> dict[str, float]:
        self._step("measure")
        return {"tps": 42}

    def restore(self) -> None:
        self._step("restore")


def test_run_trial_completes_and_restores() -> None:
    target = RecordingTarget()
    outcome = target.run_trial({"threads": 2, "turbo": True})
    assert outcome == TrialOutcome(TrialStatus.COMPLETED, {"tps": 42.0})
    assert isinstance(outcome.metrics["tps"], float)
    assert target.calls == ["apply", "measure", "restore"]


def test_config_rejected_is_infeasible_and_restores() -> None:
    target = RecordingTarget(fail_in="apply", error=ConfigRejected("server would not start"))
    outcome = target.run_trial({})
    assert outcome.status is TrialStatus.INFEASIBLE
    assert outcome.reason == "server would not start" and outcome.metrics == {}
    assert target.calls == ["apply", "restore"]


def test_target_error_is_failed_and_restores() -> None:
    target = RecordingTarget(fail_in="measure", error=TargetError("disk full"))
    outcome = target.run_trial({})
    assert (outcome.status, outcome.reason) == (TrialStatus.FAILED, "disk full")
    assert target.calls == ["apply", "measure", "restore"]


@pytest.mark.parametrize("error", [RuntimeError("bug"), KeyboardInterrupt(), SystemExit(143)])
def test_other_exceptions_propagate_after_restore(error: BaseException) -> None:
    target = RecordingTarget(fail_in="measure", error=error)
    with pytest.raises(type(error)):
        target.run_trial({})
    assert target.calls == ["apply", "measure", "restore"]


def test_a_failing_restore_is_not_swallowed() -> None:
    target = RecordingTarget(fail_in="restore", error=TargetError("could not delete"))
    with pytest.raises(TargetError, match="could not delete"):
        target.run_trial({})


def test_context_manager_runs_setup_and_close() -> None:
    target = RecordingTarget()
    with target as entered:
        assert entered is target
        assert target.calls == ["setup"]
    assert target.calls == ["setup", "close"]


def test_close_runs_when_the_body_raises() -> None:
    target = RecordingTarget()
    with pytest.raises(RuntimeError, match="body"), target:
        raise RuntimeError("body")
    assert target.calls == ["setup", "close"]


def test_close_runs_when_setup_fails() -> None:
    target = RecordingTarget(fail_in="setup", error=TargetError("no space"))
    with pytest.raises(TargetError, match="no space"), target:
        pytest.fail("the body must not run")
    assert target.calls == ["setup", "close"]


def test_default_config_comes_from_the_knobs() -> None:
    assert RecordingTarget().default_config() == {"threads": 2, "turbo": False}


def test_from_options_builds_and_rejects_unknown_options() -> None:
    target = RecordingTarget.from_options({"fail_in": "apply"})
    assert target.fail_in == "apply"
    assert option_names(RecordingTarget) == ("fail_in", "error")
    with pytest.raises(ValidationError, match="unknown option for a recording target") as info:
        RecordingTarget.from_options({"fail_on": "apply"})
    assert info.value.field == "target.fail_on"
    assert "fail_in" in str(info.value) and "error" in str(info.value)
    with pytest.raises(ValidationError, match="options must be a table"):
        RecordingTarget.from_options(["fail_in"])  # type: ignore[arg-type]


@pytest.mark.parametrize("status", [TrialStatus.PENDING, TrialStatus.ABANDONED, "DONE"])
def test_outcome_status_must_be_a_final_measured_status(status: Any) -> None:
    with pytest.raises(ValidationError, match="is not a trial outcome") as info:
        TrialOutcome(status)
    assert info.value.field == "outcome.status"
    assert "COMPLETED" in str(info.value) and "TIMED_OUT" in str(info.value)


def test_outcome_accepts_status_strings_and_rejects_non_numeric_metrics() -> None:
    assert TrialOutcome("TIMED_OUT").status is TrialStatus.TIMED_OUT  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match=r"outcome\.metrics\.tps"):
        TrialOutcome(TrialStatus.COMPLETED, {"tps": "fast"})  # type: ignore[dict-item]
    with pytest.raises(ValidationError, match=r"outcome\.metrics\.ok"):
        TrialOutcome(TrialStatus.COMPLETED, {"ok": True})


def test_option_number() -> None:
    assert option_number("x", 3, 0, 10) == 3.0
    assert option_number("x", 0, 0, 10) == 0.0
    for bad in (-1, 11, float("nan"), True, "3"):
        with pytest.raises(ValidationError, match=r"target\.x.*a number in \[0, 10\]"):
            option_number("x", bad, 0, 10)
    with pytest.raises(ValidationError, match=r"a number in \(0, 10\]"):
        option_number("x", 0, 0, 10, open_low=True)


def test_option_int_list_and_directory(tmp_path: Path) -> None:
    assert option_int("seed", 7, 0, 10) == 7
    for bad in (1.5, True, 11):
        with pytest.raises(ValidationError, match=r"target\.seed.*an integer in \[0, 10\]"):
            option_int("seed", bad, 0, 10)
    assert option_names_list("knobs", None) is None
    assert option_names_list("knobs", ("a", "b")) == ["a", "b"]
    with pytest.raises(ValidationError, match=r"target\.knobs.*a list of names"):
        option_names_list("knobs", "a")
    with pytest.raises(ValidationError, match="3 is not a name"):
        option_names_list("knobs", ["a", 3])
    assert option_directory("workdir", str(tmp_path)) == tmp_path
    assert option_directory("workdir", None) is None
    with pytest.raises(ValidationError, match=r"target\.workdir.*an existing directory"):
        option_directory("workdir", str(tmp_path / "missing"))


class FallbackSigterm(Exception):
    """Raised by the test's own handler: terminate_on_sigterm did not take over."""


def _fallback(signum: int, frame: object) -> None:
    raise FallbackSigterm


@pytest.fixture
def fallback_handler() -> Iterator[None]:
    """A SIGTERM handler that keeps a broken terminate_on_sigterm from killing pytest."""
    previous = signal.signal(signal.SIGTERM, _fallback)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.usefixtures("fallback_handler")
def test_sigterm_becomes_system_exit_143_and_the_handler_is_restored() -> None:
    with pytest.raises(SystemExit) as info, terminate_on_sigterm():
        signal.raise_signal(signal.SIGTERM)
    assert info.value.code == SIGTERM_EXIT_STATUS == 143
    assert signal.getsignal(signal.SIGTERM) is _fallback
    with pytest.raises(FallbackSigterm):
        signal.raise_signal(signal.SIGTERM)


@pytest.mark.usefixtures("fallback_handler")
def test_a_second_sigterm_cannot_interrupt_the_cleanup() -> None:
    cleaned = []
    with pytest.raises(SystemExit), terminate_on_sigterm():
        try:
            signal.raise_signal(signal.SIGTERM)
        finally:
            signal.raise_signal(signal.SIGTERM)  # ignored: the cleanup below still runs
            cleaned.append(True)
    assert cleaned == [True]


@pytest.mark.usefixtures("fallback_handler")
def test_sigterm_during_a_trial_still_restores() -> None:
    class SignalledTarget(RecordingTarget):
        def measure(self) -> dict[str, float]:
            self.calls.append("measure")
            signal.raise_signal(signal.SIGTERM)
            return {"tps": 1.0}

    target = SignalledTarget()
    with pytest.raises(SystemExit), terminate_on_sigterm(), target:
        target.run_trial({})
    assert target.calls == ["setup", "apply", "measure", "restore", "close"]


def test_terminate_on_sigterm_needs_the_main_thread() -> None:
    errors: list[BaseException] = []

    def enter() -> None:
        try:
            with terminate_on_sigterm():
                pass
        except RuntimeError as exc:
            errors.append(exc)

    thread = threading.Thread(target=enter)
    thread.start()
    thread.join()
    assert len(errors) == 1 and "main thread" in str(errors[0])
