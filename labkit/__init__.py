"""labkit: the small library behind the GRPO course lab.

Modules, in the order the chapters use them:
    task      StockArithmetic-v1: problems, solver, statements, splits
    data      the committed data files and phase separation
    verifier  parse and score a response; the exact reasons it is invalid
    runs      run folders, manifests, atomic writes, digests
"""

__version__ = "0.1.0"
