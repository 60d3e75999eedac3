"""Tests for targets.registry: kinds, lazy adapter import, option validation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from targets.base import Target
from targets.db.sqlite.target import SqliteTarget
from targets.registry import TARGET_KINDS, build_target, target_class, target_options
from tuner.errors import ValidationError


def test_every_kind_builds_a_target_of_that_kind() -> None:
    assert "sqlite" in TARGET_KINDS
    for kind in TARGET_KINDS:
        cls = target_class(kind)
        assert issubclass(cls, Target) and cls.kind == kind


def test_build_sqlite_target_with_options(tmp_path: Path) -> None:
    target = build_target(
        "sqlite", {"db_mb": 2, "measure_s": 1, "workdir": str(tmp_path), "knobs": ["synchronous"]}
    )
    assert isinstance(target, SqliteTarget)
    assert (target.db_mb, target.measure_s, target.workdir) == (2.0, 1.0, tmp_path)
    assert [knob.name for knob in target.describe_knobs()] == ["synchronous"]
    assert target.directory is None  # built, not started


def test_build_target_defaults() -> None:
    target = build_target("sqlite")
    assert isinstance(target, SqliteTarget)
    assert (target.db_mb, target.measure_s, target.warmup_s) == (32.0, 3.0, 0.5)
    assert (target.write_fraction, target.range_fraction, target.seed) == (0.3, 0.2, 0)
    assert {knob.name for knob in target.describe_knobs()} >= {"journal_mode", "page_size"}


@pytest.mark.parametrize("kind", ["postgres-ish", "", 3])
def test_unknown_kind_lists_the_kinds(kind: Any) -> None:
    with pytest.raises(ValidationError, match="unknown target kind") as info:
        build_target(kind, {})
    assert info.value.field == "target.kind"
    assert info.value.allowed == TARGET_KINDS
    assert "'sqlite'" in str(info.value)


def test_unknown_option_lists_the_options() -> None:
    with pytest.raises(ValidationError, match="unknown option for a sqlite target") as info:
        build_target("sqlite", {"db_size": 10})
    assert info.value.field == "target.db_size"
    for name in ("db_mb", "measure_s", "warmup_s", "write_fraction", "knobs", "workdir"):
        assert name in str(info.value)
    assert set(target_options("sqlite")) == set(info.value.allowed)


def test_allow_unsafe_is_not_a_target_option() -> None:
    with pytest.raises(ValidationError) as info:
        build_target("sqlite", {"allow_unsafe": True})
    assert info.value.field == "target.allow_unsafe"


@pytest.mark.parametrize(
    ("options", "field", "allowed"),
    [
        ({"db_mb": 0}, "target.db_mb", "a number in (0"),
        ({"db_mb": "big"}, "target.db_mb", "a number in (0"),
        ({"measure_s": 0}, "target.measure_s", "a number in [0.01, 3600]"),
        ({"warmup_s": -1}, "target.warmup_s", "a number in [0"),
        ({"write_fraction": 1.5}, "target.write_fraction", "a number in [0, 1]"),
        ({"write_fraction": 0.7, "range_fraction": 0.5}, "target.range_fraction", "<= 1"),
        ({"seed": -1}, "target.seed", "an integer in [0"),
        ({"seed": 1.5}, "target.seed", "an integer in [0"),
        ({"workdir": "/no/such/dir"}, "target.workdir", "an existing directory"),
        ({"knobs": "journal_mode"}, "target.knobs", "a list of names"),
        ({"knobs": []}, "target.knobs", "journal_mode"),
        ({"knobs": ["journal_mode", "fsync"]}, "target.knobs[1]", "synchronous"),
    ],
)
def test_invalid_option_values_name_the_field_and_what_is_allowed(
    options: dict[str, Any], field: str, allowed: str
) -> None:
    with pytest.raises(ValidationError) as info:
        build_target("sqlite", options)
    assert info.value.field == field
    assert allowed in str(info.value)
