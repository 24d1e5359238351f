"""rtj.settings (one object, each default once, bounds checked at startup) and the two entry points
(`python -m rtj` is `kopf run -m rtj.handlers`: the same options)."""

from __future__ import annotations

import pytest
from rtj import __main__ as entry
from rtj.settings import Settings

pytestmark = pytest.mark.unit


def test_unset_or_empty_variables_keep_the_defaults() -> None:
    assert Settings.from_env({}) == Settings()
    assert Settings.from_env({"RTJ_RECONCILE_INTERVAL_SECONDS": " "}) == Settings()


def test_each_field_is_read_from_rtj_and_its_name() -> None:
    s = Settings.from_env(
        {"RTJ_RECONCILE_INTERVAL_SECONDS": "5", "RTJ_LOG_LEVEL": "debug", "RTJ_METRICS_PORT": "0"}
    )
    assert (s.reconcile_interval_seconds, s.log_level, s.metrics_port) == (5.0, "DEBUG", 0)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("RTJ_METRICS_PORT", "http"),
        ("RTJ_METRICS_PORT", "70000"),
        ("RTJ_RECONCILE_INTERVAL_SECONDS", "0"),
        ("RTJ_FAULT_GRACE_SECONDS", "-1"),
        ("RTJ_LOG_LEVEL", "LOUD"),
    ],
)
def test_a_bad_value_stops_the_operator_naming_the_variable(name: str, value: str) -> None:
    with pytest.raises(SystemExit, match=name):
        Settings.from_env({name: value})


def test_python_dash_m_rtj_is_kopf_run_with_the_same_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        entry.main(["--help"])
    assert done.value.code == 0
    help_text = capsys.readouterr().out
    assert "Usage: python -m rtj run" in help_text
    assert all(option in help_text for option in ("--namespace", "--all-namespaces", "--liveness"))
