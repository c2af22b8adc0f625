"""Test-session settings.

One torch thread: the models under test are tiny, so a second thread buys
nothing, and on a busy 2-core machine OpenMP threads that wait for each other
make a 7 ms forward take hundreds of milliseconds.  Set at import (for what
collection builds) and again before every test's fixtures are set up, since some
code under test (the CLI's --threads) sets its own count.

The `portable` marker: `make test` runs the unit tests once with the kernels this CPU picks;
`make test-slow` (CI, after it) runs again, under PyTorch's portable kernels (ATEN_CPU_CAPABILITY=default, which round
differently), only the tests whose outcome could depend on how a CPU rounds: those that
compare a computation with a stored value (the committed run, models, snapshots, evaluations)
and those that compare two implementations of one function within a tolerance.  A test that
compares a process with itself (a kill and resume, a deterministic rerun) or checks files,
messages and pure-Python logic gives the same verdict under any kernel, so it runs once.  The
lists are in tests/portable.py; its TORCH_FREE_FILES compare stored values without torch, which
the hooks below check.
"""

import pytest
import torch
from portable import PORTABLE_FILES, PORTABLE_TESTS, TORCH_FREE_FILES  # tests/portable.py, also read by phases.py
from torch.utils._python_dispatch import TorchDispatchMode

torch.set_num_threads(1)


# The slowest files first (measured 2026-12-07, tests/phases.py's LONGEST_FIRST): with --no-loadscope-reorder,
# pytest-xdist's `loadfile` gives a worker the next file in collection order when it finishes one, so the long
# ones go out first and the two workers end together (xdist's own order, by number of tests, sent a 36-s file
# out last and one worker idled ~30 s).
SLOWEST_FIRST = ("test_grpo.py", "test_variants.py", "test_results_page.py", "test_reasoning_loop.py",
                 "test_pretrain_resume.py", "test_ablations.py", "test_group_size.py", "test_sft.py", "test_sweep.py",
                 "test_fault_injection.py", "test_fault_injection_sft.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
    for item in items:
        name = item.path.name
        if name in PORTABLE_FILES or item.originalname in PORTABLE_TESTS.get(name, ()):
            item.add_marker(pytest.mark.portable)


class _TorchOperations(TorchDispatchMode):
    """Counts the ATen operations run while it is active (each one could round by the CPU's kernels)."""

    def __init__(self):
        super().__init__()
        self.seen: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen[str(func)] = self.seen.get(str(func), 0) + 1
        return func(*args, **(kwargs or {}))


def _torch_free(item, phase: str):
    """Run a TORCH_FREE_FILES test's `phase` under the counter; any operation fails the test, naming it."""
    if item.path.name not in TORCH_FREE_FILES:
        return (yield)
    with _TorchOperations() as counter:
        result = yield
    if counter.seen:
        ops = ", ".join(f"{op} x{n}" for op, n in sorted(counter.seen.items(), key=lambda kv: -kv[1])[:3])
        pytest.fail(f"{item.nodeid} ran torch operations in its {phase} ({ops}): its verdict can depend on the "
                    "CPU's kernels, so move its file from TORCH_FREE_FILES to PORTABLE_FILES (tests/portable.py)",
                    pytrace=False)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    torch.set_num_threads(1)  # before any fixture of the test is set up
    return (yield from _torch_free(item, "set-up"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    return (yield from _torch_free(item, "call"))
