"""StockArithmetic-v1, the task the lab trains on, and its checker.

    problems  the problems, their solver, statements and splits (generated from a seed)
    verifier  parse and score a response, with the exact reason it is invalid; never raises
    data      the committed data files, the learning and evaluation phases kept apart
    worked    worked answers (chapter 11): the format with room to think, and its checker

May import: lab.
"""
