"""Test-session settings.

One torch thread: the models under test are tiny, so a second thread buys
nothing, and on a busy 2-core machine OpenMP threads that wait for each other
make a 7 ms forward take hundreds of milliseconds.  Set at import (for what
collection builds) and again before every test's fixtures are set up, since some
code under test (the CLI's --threads) sets its own count.
"""

import pytest
import torch

torch.set_num_threads(1)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    torch.set_num_threads(1)
