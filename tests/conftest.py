"""Test-session settings.

One torch thread: the models under test are tiny, so a second thread buys
nothing, and on a busy 2-core machine OpenMP threads that wait for each other
make a 7 ms forward take hundreds of milliseconds.
"""

import torch

torch.set_num_threads(1)
