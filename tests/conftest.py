"""Test-session settings.

One torch thread: the models under test are tiny, so a second thread buys
nothing, and on a busy 2-core machine OpenMP threads that wait for each other
make a 7 ms forward take hundreds of milliseconds.  Set at import (for what
collection builds) and again before every test's fixtures are set up, since some
code under test (the CLI's --threads) sets its own count.

The `portable` marker: `make test` runs the unit tests once with the kernels this CPU picks,
then again, under PyTorch's portable kernels (ATEN_CPU_CAPABILITY=default, which round
differently), only the tests whose outcome could depend on how a CPU rounds: those that
compare a computation with a stored value (the committed run, models, snapshots, evaluations)
and those that compare two implementations of one function within a tolerance.  A test that
compares a process with itself (a kill and resume, a deterministic rerun) or checks files,
messages and pure-Python logic gives the same verdict under any kernel, so it runs once.
"""

from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

PORTABLE_FILES = {
    # stored values: the committed run, its models, evaluations, snapshots, pages and proxies
    "test_cached_run.py", "test_grpo_snapshot.py", "test_results_page.py", "test_evaluate.py",
    "test_difficulty.py", "test_metrics.py", "test_models.py", "test_paired.py", "test_reward_model.py",
    "test_format_base.py", "test_agreement.py", "test_plots_ch07.py", "test_notebook_ch10.py",
    "test_overoptimisation.py",
    # two implementations of one function, compared within a tolerance
    "test_losses.py", "test_sampling.py", "test_scoring.py", "test_shared_prompt.py", "test_static_sampler.py",
    "test_state.py",
}
PORTABLE_TESTS = {  # single tests of files that mostly run processes against themselves
    "test_sweep.py": {"test_the_committed_sweep_is_complete_for_this_code",
                      "test_the_committed_chapter10_sweep_is_complete_and_rescored_exactly"},
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        name = Path(str(item.fspath)).name
        if name in PORTABLE_FILES or item.originalname in PORTABLE_TESTS.get(name, ()):
            item.add_marker(pytest.mark.portable)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    torch.set_num_threads(1)
