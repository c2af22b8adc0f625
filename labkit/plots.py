"""The figures the chapters and the book show.

Each function takes plain data, draws on a new matplotlib figure and returns it;
the notebook calls `plt.show()`.  Shared by every chapter: add functions, in
chapter order, without rewriting the others.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
