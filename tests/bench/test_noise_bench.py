"""bench.noise: every arm on the real SQLite target, the redeploy on a fresh database, and
the summary that says how far the reported gains were from the redeployed ones."""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
from pathlib import Path
from typing import Any

import pytest

from bench import noise


def cell(level: str, arm_gains: dict[str, tuple[float, float]]) -> dict[str, Any]:
    """A finished cell whose arms reported and redeployed the given gains."""
    out: dict[str, Any] = {"level": level, "seed": 0, "redeploy": {"recipe": {"gain": 5.0}}}
    for arm, (reported, redeployed) in arm_gains.items():
        out[arm] = {"reported": reported, "runs": 40}
        out["redeploy"][arm] = {"gain": redeployed}
    return out


def test_the_summary_measures_the_gap_and_the_share_that_lost_30_percent() -> None:
    cells = [
        cell("quiet", {"protocol": (2.0, 2.1), "single": (10.0, 6.0)}),  # single lost 40 %
        cell("quiet", {"protocol": (3.0, 3.0), "single": (8.0, 7.0)}),
    ]
    rows = {(r["level"], r["arm"]): r for r in noise.summarize(cells)}
    protocol, single = rows["quiet", "protocol"], rows["quiet", "single"]
    assert protocol["gap"] == pytest.approx((2.0 / 2.1 - 1 + 0.0) / 2)
    assert single["median_gap"] == pytest.approx((10 / 6 - 1 + 8 / 7 - 1) / 2)
    assert protocol["lost_30"] == 0.0 and single["lost_30"] == 0.5
    assert single["reported"] == pytest.approx(9.0) and single["redeployed"] == pytest.approx(6.5)
    assert rows["quiet", "recipe"]["redeployed"] == 5.0
    assert math.isnan(rows["quiet", "recipe"]["lost_30"])
    assert ("moderate", "protocol") not in rows
    assert single["no_ratio"] == 0


def test_the_summary_counts_confirmed_intervals_that_hold_the_redeployed_gain() -> None:
    cells = [
        cell("quiet", {"protocol": (2.0, 2.1)}),  # inside 1.8-2.2
        cell("quiet", {"protocol": (3.0, 2.0)}),  # outside 2.7-3.3
        cell("quiet", {"protocol": (1.0, 1.0)}),  # kept the default: no interval counts
    ]
    for c, (low, high) in zip(cells, [(1.8, 2.2), (2.7, 3.3), (0.8, 1.2)], strict=True):
        c["protocol"].update(interval={"low": low, "high": high}, keeps_default=False)
    cells[2]["protocol"]["keeps_default"] = True
    [protocol, _] = noise.summarize(cells)
    assert protocol["arm"] == "protocol" and protocol["covered"] == 0.5
    assert "| 50% |" in noise_markdown([protocol])


def test_a_single_sample_session_whose_default_broke_a_constraint_reported_no_gain() -> None:
    none = cell("quiet", {"protocol": (2.0, 2.0), "single": (1.0, 6.0)})
    none["single"]["reported"] = None
    none["single"]["default_feasible"] = False
    old = cell("quiet", {"protocol": (2.0, 2.0), "single": (1.0, 5.0)})  # before the key
    ok = cell("quiet", {"protocol": (2.0, 2.0), "single": (8.0, 7.0)})
    ok["single"]["default_feasible"] = True
    rows = {(r["level"], r["arm"]): r for r in noise.summarize([none, old, ok])}
    single = rows["quiet", "single"]
    assert single["no_ratio"] == 2 and single["sessions"] == 1
    assert single["reported"] == 8.0 and single["gap"] == pytest.approx(8 / 7 - 1)
    assert rows["quiet", "protocol"]["sessions"] == 3  # keeping the default reports 1.0x


@pytest.fixture
def short_confirmation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The SQLite example study with a shorter closing confirmation: one round that chooses
    between the two best, then two that estimate (7 measurements; the example's takes 16
    with 3 trials). The single-sample arm runs as many trials as the protocol arm measured,
    so it runs 10 (the 8 of the initial design, then 2 BO steps) instead of 19."""
    system = noise.SYSTEMS["sqlite"]
    data = tomllib.loads(system.example.read_text(encoding="utf-8"))
    data["session"].update(confirm=2, confirm_select=1, confirm_top=2)
    example = tmp_path / "example" / system.example.name
    example.parent.mkdir()
    example.write_text(noise.to_toml(data), encoding="utf-8")
    monkeypatch.setitem(noise.SYSTEMS, "sqlite", dataclasses.replace(system, example=example))


@pytest.mark.slow
@pytest.mark.usefixtures("short_confirmation")
def test_a_tiny_run_measures_every_arm_and_redeploys_on_a_fresh_database(tmp_path: Path) -> None:
    code = noise.main(
        ["--seeds", "1", "--levels", "quiet", "--trials", "3", "--measure-s", "0.05",
         "--warmup-s", "0.02", "--db-mb", "1", "--redeploy", "2", "--out", str(tmp_path)]
    )  # fmt: skip
    assert code == 0
    [done] = json.loads((tmp_path / "cells.json").read_text())["cells"]
    protocol, single, confirmed = done["protocol"], done["single"], done["confirm"]
    # equal measurement time: the single-sample arm ran as many measurements, and the
    # confirm-only arm as many trials as the protocol's measurements outside its confirmation
    assert single["runs"] == protocol["runs"] > 3
    assert protocol["confirm_runs"] > 0 and confirmed["confirm_runs"] > 0
    assert confirmed["runs"] - confirmed["confirm_runs"] == max(
        protocol["runs"] - protocol["confirm_runs"], 3
    )
    assert protocol["reported"] >= 1.0 and confirmed["reported"] >= 1
    assert single["reported"] is None or single["reported"] > 0
    for arm in ("protocol", "single", "confirm", "recipe"):
        assert done["redeploy"][arm]["gain"] is None or done["redeploy"][arm]["gain"] > 0
    assert (tmp_path / "noise.png").stat().st_size > 0
    # a second run with the same settings resumes: nothing is measured again
    assert noise.main(["--seeds", "1", "--levels", "quiet", "--out", str(tmp_path)]) == 0
    assert len(json.loads((tmp_path / "cells.json").read_text())["cells"]) == 1


@pytest.mark.slow
def test_the_grow_arm_runs_beside_the_protocol_alone(tmp_path: Path) -> None:
    code = noise.main(
        ["--seeds", "1", "--levels", "quiet", "--trials", "3", "--measure-s", "0.05",
         "--warmup-s", "0.02", "--db-mb", "1", "--redeploy", "2", "--out", str(tmp_path),
         "--arms", "protocol,grow", "--grow-to", "7"]
    )  # fmt: skip
    assert code == 0
    [done] = json.loads((tmp_path / "cells.json").read_text())["cells"]
    assert "single" not in done and "confirm" not in done
    grow = done["grow"]
    # 2 selection rounds of the default and up to 3 candidates, then at most 7 rounds of two
    assert 0 < grow["confirm_runs"] <= 2 * 4 + 7 * 2
    assert set(done["redeploy"]) >= {"protocol", "grow", "recipe"}
    rows = {(r["level"], r["arm"]) for r in noise.summarize([done])}
    assert ("quiet", "grow") in rows and ("quiet", "single") not in rows


@pytest.mark.parametrize(
    ("arms", "says"),
    [("protocol,fast", "unknown arm 'fast'"), ("single,protocol", "protocol first"),
     ("protocol,grow,grow", "each arm once")],
)  # fmt: skip
def test_bad_arms_are_refused_by_name(
    arms: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        noise.main(["--arms", arms, "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert "--arms" in err and says in err
    assert not (tmp_path / "cells.json").exists()


def test_an_arm_that_never_reported_a_gain_still_has_its_row() -> None:
    cells = []
    for _ in range(2):
        c = cell("moderate", {"protocol": (2.0, 2.0), "single": (1.0, 6.0)})
        c["single"].update(reported=None, default_feasible=False)
        cells.append(c)
    rows = {(r["level"], r["arm"]): r for r in noise.summarize(cells)}
    single = rows["moderate", "single"]
    assert single["sessions"] == 0 and single["no_ratio"] == 2 and math.isnan(single["gap"])
    assert "| moderate | single | 0 | 2 |" in noise_markdown(rows.values())


def noise_markdown(rows: Any) -> str:
    from io import StringIO

    from rich.console import Console

    out = StringIO()
    Console(file=out, width=200).print(noise.table(list(rows)))
    return " ".join(out.getvalue().split()).replace("│", "|")
