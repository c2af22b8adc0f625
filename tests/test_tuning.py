"""The `tune` command refuses bad rates by name before it trains anything."""

from __future__ import annotations

import pytest

from labkit import cli


@pytest.mark.parametrize("rates, message", [("fast", "expected comma-separated numbers"),
                                            ("1e-3,-2e-3", "every rate must be positive"),
                                            ("0", "every rate must be positive")])
def test_bad_rates_are_refused_with_the_rule(rates, message):
    with pytest.raises(SystemExit, match=message):
        cli.main(["tune", "warm-start", "--rates", rates])


def test_bad_threads_are_refused(capsys):
    assert cli.main(["tune", "grpo", "--rates", "1e-5", "--threads", "0"]) == 2
    assert "--threads 0: must be at least 1" in capsys.readouterr().err
