"""Issue 36, item 3: operators and runners take their settings objects. `Pack` and
`BalancedPack` take `PackSettings` / `BalanceSettings` (whose declarations hold the
defaults, choices and bounds; the keywords of before 0.4 warn), and `make_runner` takes a
frozen `RunnerSpec` derived from `Execution` instead of eight positionals."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from zephon_core import (
    BalancedPack,
    BalanceSettings,
    ConfigError,
    Element,
    Execution,
    Map,
    Origin,
    Pack,
    PackSettings,
    RunnerKind,
)
from zephon_core.extend import StageFn
from zephon_core.internals import Plan, RunnerSpec, make_runner


def test_pack_takes_its_settings_object_and_repeats_no_default():
    params = inspect.signature(Pack).parameters
    assert not {"mode", "max_open_bins", "overlong"} & set(params)
    assert params["pack"].default is None
    op = Pack(32, PackSettings("first_fit", 2, "drop"))
    assert (op.mode, op.max_open_bins, op.overlong) == ("first_fit", 2, "drop")
    assert Pack(32).settings() == Pack(32, PackSettings()).settings()
    assert Pack(32, {"max_open_bins": 2}).settings() == Pack(32, PackSettings(max_open_bins=2)
                                                            ).settings()


def test_pack_keywords_of_before_0_4_warn_and_build_the_same_operator():
    with pytest.warns(DeprecationWarning, match=r"Pack\(max_open_bins=\.\.\.\) is deprecated") as w:
        old = Pack(32, mode="first_fit", max_open_bins=3, overlong="truncate")
    assert {r.filename for r in w} == {__file__}  # at the caller's line
    new = Pack(32, PackSettings("first_fit", 3, "truncate"))
    assert old.settings() == new.settings()


@pytest.mark.parametrize("pack, match", [
    ({"max_open_bins": 0}, r"max_open_bins must be >= 1; got 0"),
    ({"pack_mode": "worst_fit"}, r"PackSettings\.pack_mode must be one of first_fit, "),
])
def test_pack_refuses_what_its_settings_declare(pack, match):
    with pytest.raises(ConfigError, match=match):
        Pack(32, pack)


def test_balanced_pack_takes_balance_settings():
    params = inspect.signature(BalancedPack).parameters
    assert not {"budget", "heavy_every", "lookahead", "tolerance", "split_text"} & set(params)
    new = BalancedPack(32, "vision", BalanceSettings(3.0, heavy_every=3, heavy_budget=12.0),
                       rows_per_group=2)
    assert new.target(2) == 12.0 and new.balance.budget == 3.0
    with pytest.warns(DeprecationWarning, match=r"BalancedPack\(seq_len, cost, budget\)") as w:
        positional = BalancedPack(32, "vision", 3.0, rows_per_group=2, heavy_every=3,
                                  heavy_budget=12.0)
    assert {r.filename for r in w} == {__file__}
    with pytest.warns(DeprecationWarning, match=r"BalancedPack\(budget=\.\.\.\)"):
        keywords = BalancedPack(32, "vision", budget=3.0, rows_per_group=2, heavy_every=3,
                                heavy_budget=12.0)
    assert positional.settings() == keywords.settings() == new.settings()
    assert new.settings()["budget"] == 3.0 and isinstance(new.settings()["tolerance"], float)


@pytest.mark.parametrize("balance, match", [
    ({"budget": 0}, r"\[balance\] budget must be > 0; got 0"),
    (BalanceSettings.__new__(BalanceSettings), None),
    ({"budget": 1.0, "tolerance": 0.5}, r"tolerance must be >= 0 and < 0\.5; got 0\.5"),
    ({"budget": 1.0, "lookahead": 0}, r"lookahead must be >= 1; got 0"),
    ({"budget": 1.0, "heavy_every": 1}, r"heavy_every must be 0 .* or >= 2"),
    ({"budget": 1.0, "heavy_every": -2}, r"heavy_every must be >= 0; got -2"),
])
def test_balance_bounds_are_declared(balance, match):
    if match is None:  # a settings object built in Python is checked by its __post_init__
        with pytest.raises(ConfigError, match=r"BalanceSettings\.budget must be > 0; got 0"):
            BalancedPack(32, "vision", BalanceSettings(0))
        return
    with pytest.raises(ConfigError, match=match):
        BalancedPack(32, "vision", balance)


def _identity(payload: object) -> object:
    return payload


def test_make_runner_takes_a_frozen_spec_from_execution():
    ex = Execution(runner="threads", default_workers=2, group_timeout=9.0,
                   ray_resources={"zephon_cpu": 1.0})
    plan = Plan([Map(_identity, name="same"), Pack(16)], ex)
    stage = plan.stages[0]
    spec = RunnerSpec.from_execution(ex, stage)
    assert spec == RunnerSpec(RunnerKind.THREADS, 2, "same", ex.start_method, 9.0, None,
                              {"zephon_cpu": 1.0}, ex.ray_connect_timeout)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.workers = 3  # type: ignore[misc]
    runner = make_runner(spec, StageFn([Map(_identity, name="same")]))
    try:
        element = Element(0, {"x": 1}, Origin(0, 0, 0, 0, 0))
        assert runner.submit([element]).result(timeout=30) == [{"x": 1}]
        assert runner.workers == 2
    finally:
        runner.close()


def test_make_runner_positionals_of_before_0_4_warn():
    fn = StageFn([Map(_identity, name="same")])
    with pytest.warns(DeprecationWarning, match=r"make_runner\(kind, fn, workers"):
        runner = make_runner("threads", fn, 3, "auto", "same")
    try:
        assert runner.workers == 3
    finally:
        runner.close()
    with pytest.raises(TypeError, match="the spec holds it all"):
        make_runner(RunnerSpec(RunnerKind.INLINE, 1, "same"), fn, 2)
