"""The CPU frequency target and the RAPL meter against fake sysfs trees, with a real workload
subprocess that reads the frequency limits it runs under and burns fake energy."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from runner.config import parse_config
from targets.hardware.cpufreq import CPUFREQ, CpuFreqTarget
from targets.hardware.fake_sysfs import ACPI_TABLE, add_rapl_zone, make_cpufreq_tree
from targets.hardware.rapl import RaplMeter
from targets.registry import build_target
from tuner.errors import TargetError, ValidationError
from tuner.trial import TrialStatus

PY = sys.executable
# The workload: reports the limits of policy0 it ran under, and adds $BURN_UJ to every
# fake energy counter listed in $COUNTERS (wrapping at $WRAP), as a CPU would. A counter is
# replaced whole (a sibling file, then a rename): a read of sysfs never sees a half-written
# number, and the meter's poll thread reads while the workload writes.
WORKLOAD = textwrap.dedent(
    """
    import json, os, sys
    policy = os.path.join(os.environ["SYSFS"], "devices/system/cpu/cpufreq/policy0")
    low = int(open(os.path.join(policy, "scaling_min_freq")).read())
    high = int(open(os.path.join(policy, "scaling_max_freq")).read())
    for counter in filter(None, os.environ.get("COUNTERS", "").split("|")):
        value = int(open(counter).read()) + int(os.environ["BURN_UJ"])
        open(counter + ".new", "w").write(str(value % (int(os.environ["WRAP"]) + 1)))
        os.replace(counter + ".new", counter)
    print(json.dumps({"low_khz": low, "high_khz": high, "ops": 10.0}))
    if os.environ.get("FAIL"):
        sys.exit(1)
    """
)


@pytest.fixture
def workload(tmp_path: Path) -> Path:
    path = tmp_path / "workload.py"
    path.write_text(WORKLOAD, encoding="utf-8")
    return path


def cpu_target(root: Path, workload: Path, **options: Any) -> CpuFreqTarget:
    env = {"SYSFS": str(root), **options.pop("env", {})}
    built = build_target(
        "cpufreq",
        {
            "sysfs": str(root),
            "command": [PY, str(workload)],
            "metrics": ["low_khz", "high_khz"],
            "env": env,
            **options,
        },
    )
    assert isinstance(built, CpuFreqTarget)
    return built


def limits(root: Path, policy: str = "policy0") -> tuple[int, int]:
    folder = root / CPUFREQ / policy
    return (
        int((folder / "scaling_min_freq").read_text()),
        int((folder / "scaling_max_freq").read_text()),
    )


def test_levels_come_from_the_table_or_from_the_hardware_range(tmp_path: Path) -> None:
    acpi = make_cpufreq_tree(tmp_path / "acpi", policies=2)
    target = cpu_target(acpi, tmp_path / "w.py")
    (knob,) = target.describe_knobs()
    assert knob.name == "cpu_khz" and knob.choices == ACPI_TABLE
    assert knob.default == max(ACPI_TABLE) and knob.unit == "kHz"
    pstate = make_cpufreq_tree(tmp_path / "pstate", driver="intel_pstate")
    target = cpu_target(pstate, tmp_path / "w.py", levels=5)
    (knob,) = target.describe_knobs()
    assert knob.choices == (800_000, 1_300_000, 1_800_000, 2_300_000, 2_800_000)


@pytest.mark.parametrize("mode", ["pin", "cap"])
def test_each_trial_runs_at_its_level_and_the_limits_come_back(
    tmp_path: Path, workload: Path, mode: str
) -> None:
    root = make_cpufreq_tree(tmp_path, policies=2)
    (root / CPUFREQ / "policy1" / "scaling_max_freq").write_text("2400000\n")  # user's cap
    before = [limits(root), limits(root, "policy1")]
    with cpu_target(root, workload, mode=mode) as target:
        for khz in (1_200_000, 2_800_000, 800_000):
            outcome = target.run_trial({"cpu_khz": khz})
            assert outcome.status is TrialStatus.COMPLETED, outcome.reason
            expected_low = khz if mode == "pin" else 800_000
            assert (outcome.metrics["low_khz"], outcome.metrics["high_khz"]) == (
                expected_low,
                khz,
            )
            assert [limits(root), limits(root, "policy1")] == before  # restored after each
    assert [limits(root), limits(root, "policy1")] == before


def test_limits_are_restored_after_a_failed_workload_and_at_close(
    tmp_path: Path, workload: Path
) -> None:
    root = make_cpufreq_tree(tmp_path)
    before = limits(root)
    with cpu_target(root, workload, env={"FAIL": "1"}) as target:
        outcome = target.run_trial({"cpu_khz": 1_600_000})
        assert outcome.status is TrialStatus.FAILED and "exit status 1" in outcome.reason
        assert limits(root) == before
        target.apply({"cpu_khz": 800_000})  # a session killed between apply and restore
        assert limits(root) == (800_000, 800_000)
    assert limits(root) == before


def test_a_limit_the_kernel_does_not_keep_is_infeasible(tmp_path: Path, workload: Path) -> None:
    root = make_cpufreq_tree(tmp_path)
    target = cpu_target(root, workload)
    policy = target.policies[0]
    real = policy.set_limits

    def clamp(low: int, high: int, write: Any) -> None:  # a thermal limit: max stays 2.0 GHz
        real(min(low, 2_000_000), min(high, 2_000_000), write)

    policy.set_limits = clamp  # type: ignore[method-assign]
    with target:
        outcome = target.run_trial({"cpu_khz": 2_800_000})
        assert outcome.status is TrialStatus.INFEASIBLE
        assert "the kernel kept [2000000, 2000000]" in outcome.reason
        assert target.run_trial({"cpu_khz": 1_200_000}).status is TrialStatus.COMPLETED
    assert limits(root) == (800_000, 2_800_000)


def test_energy_from_rapl_with_a_wraparound(tmp_path: Path, workload: Path) -> None:
    root = make_cpufreq_tree(tmp_path)
    wrap = 10_000_000
    package = add_rapl_zone(root, "package-0", energy_uj=wrap - 1_000_000, max_range_uj=wrap)
    dram = add_rapl_zone(root, "dram", energy_uj=5, max_range_uj=wrap)
    env = {"COUNTERS": f"{package}|{dram}", "BURN_UJ": "3000000", "WRAP": str(wrap)}
    with cpu_target(root, workload, env=env) as target:
        assert {"energy_j", "power_w"} <= set(target.describe_metrics())
        outcome = target.run_trial({"cpu_khz": 1_200_000})
    assert outcome.status is TrialStatus.COMPLETED
    assert outcome.metrics["energy_j"] == pytest.approx(3.0)  # package only, across the wrap
    assert outcome.metrics["power_w"] > 0
    with cpu_target(root, workload, env=env, dram=True) as target:
        outcome = target.run_trial({"cpu_khz": 1_200_000})
    assert outcome.metrics["energy_j"] == pytest.approx(6.0)  # package + dram


def test_energy_is_the_timed_windows_when_the_workload_reports_one(tmp_path: Path) -> None:
    """Start-up energy (5 J here, as a Python process importing torch burns) is not charged to
    the requests: the meter's 50 ms samples give the energy of the window the workload timed."""
    root = make_cpufreq_tree(tmp_path)
    counter = add_rapl_zone(root, "package-0", energy_uj=0)
    script = tmp_path / "windowed.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json, os, time
            def burn(uj):  # replaced whole, as in WORKLOAD
                value = int(open({str(counter)!r}).read()) + uj
                open({str(counter)!r} + ".new", "w").write(str(value))
                os.replace({str(counter)!r} + ".new", {str(counter)!r})
            burn(5_000_000); time.sleep(0.3)       # start-up
            a = time.monotonic()
            for _ in range(10):
                burn(100_000); time.sleep(0.04)    # the timed part: 1 J over 0.4 s
            b = time.monotonic()
            time.sleep(0.2)
            print(json.dumps(dict(requests=4, window_start_s=a, window_end_s=b)))
            """
        )
    )
    target = build_target("cpufreq", {"sysfs": str(root), "command": [PY, str(script)],
                                      "metrics": ["requests"]})  # fmt: skip
    with target:
        outcome = target.run_trial({"cpu_khz": 1_200_000})
    assert outcome.status is TrialStatus.COMPLETED, outcome.reason
    metrics = outcome.metrics
    assert metrics["energy_j"] == pytest.approx(1.0, abs=0.25)  # not 6 J
    assert metrics["power_w"] == pytest.approx(2.5, rel=0.3)
    assert metrics["energy_j_per_request"] == pytest.approx(metrics["energy_j"] / 4)


def test_no_readable_energy_means_no_energy_metric(tmp_path: Path, workload: Path) -> None:
    root = make_cpufreq_tree(tmp_path)
    target = cpu_target(root, workload)
    assert target.meter is None and "energy_j" not in target.describe_metrics()
    with target:
        outcome = target.run_trial({"cpu_khz": 1_200_000})
    assert "energy_j" not in outcome.metrics
    config = {
        "study": {"name": "e", "objectives": [{"name": "energy_j", "goal": "minimize"}]},
        "target": {
            "kind": "cpufreq",
            "sysfs": str(root),
            "command": [PY, str(workload)],
            "metrics": ["ops"],
        },
    }
    with pytest.raises(ValidationError) as info:
        parse_config(config, {})
    assert info.value.field == "study.objectives[0].name" and "energy_j" in str(info.value)


def test_rapl_meter_sums_modular_differences(tmp_path: Path) -> None:
    counter = add_rapl_zone(tmp_path, "package-0", energy_uj=90, max_range_uj=99)
    add_rapl_zone(tmp_path, "core", energy_uj=0)  # a subzone of the package: not summed
    meter = RaplMeter.find(tmp_path, poll_s=60)
    assert meter is not None and [z.name for z in meter.zones] == ["package-0"]
    meter.start()
    counter.write_text("10")  # 90 -> 99 -> 0 -> 10: 20 uJ
    meter._sample()
    counter.write_text("30")
    assert meter.stop() == pytest.approx(40e-6)


def test_config_study_over_frequency_and_workload_knobs(tmp_path: Path, workload: Path) -> None:
    root = make_cpufreq_tree(tmp_path)
    config = {
        "study": {
            "name": "cpu",
            "objectives": [{"name": "low_khz", "goal": "minimize"}],
            "knobs": [
                {"name": "cpu_khz", "kind": "ordinal", "choices": list(ACPI_TABLE)},
                {"name": "batch", "kind": "int", "low": 1, "high": 8},
            ],
        },
        "target": {
            "kind": "cpufreq",
            "sysfs": str(root),
            "command": [PY, str(workload), "--batch", "{batch}"],
            "metrics": ["low_khz", "high_khz"],
            "env": {"SYSFS": str(root)},
        },
    }
    parsed = parse_config(config, {})
    assert parsed.spec.space.names == ("cpu_khz", "batch")
    with parsed.target as target:
        outcome = target.run_trial({"cpu_khz": 1_600_000, "batch": 4})
    assert outcome.metrics["low_khz"] == 1_600_000
    wrong = json.loads(json.dumps(config))
    wrong["target"]["command"] = [PY, str(workload), "{batch_size}"]
    with pytest.raises(ValidationError) as info:
        parse_config(wrong, {})
    assert info.value.field == "target.command[2]"


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"mode": "turbo"}, "target.mode"),
        ({"levels": 1}, "target.levels"),
        ({"policies": ["policy7"]}, "target.policies.policy7"),
        ({"dram": "yes"}, "target.dram"),
    ],
)
def test_bad_options_name_the_field(
    tmp_path: Path, workload: Path, options: dict[str, Any], field: str
) -> None:
    root = make_cpufreq_tree(tmp_path)
    with pytest.raises(ValidationError) as info:
        cpu_target(root, workload, **options)
    assert info.value.field == field


def test_a_machine_without_cpufreq_is_a_clear_error(tmp_path: Path, workload: Path) -> None:
    with pytest.raises(ValidationError, match="no cpufreq policies"):
        cpu_target(tmp_path, workload)


def test_limits_are_written_in_an_order_the_kernel_accepts(
    tmp_path: Path, workload: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Like the kernel, refuse any write that would leave scaling_min_freq > scaling_max_freq."""
    root = make_cpufreq_tree(tmp_path)
    (root / CPUFREQ / "policy0" / "scaling_min_freq").write_text("1600000\n")
    (root / CPUFREQ / "policy0" / "scaling_max_freq").write_text("2000000\n")
    target = cpu_target(root, workload)
    real = target.write

    def kernel_write(path: Path, text: str) -> None:
        low, high = (
            int((path.parent / f).read_text()) for f in ("scaling_min_freq", "scaling_max_freq")
        )
        if path.name == "scaling_min_freq":
            low = int(text)
        elif path.name == "scaling_max_freq":
            high = int(text)
        if low > high:
            raise TargetError(f"EINVAL: {path.name} = {text} with min {low} > max {high}")
        real(path, text)

    target.write = kernel_write  # the kernel's rule on top of the real writes
    with target:
        for khz in (800_000, 2_800_000, 1_200_000, 2_400_000, 2_000_000):
            outcome = target.run_trial({"cpu_khz": khz})
            assert outcome.status is TrialStatus.COMPLETED, outcome.reason
            assert limits(root) == (1_600_000, 2_000_000)
