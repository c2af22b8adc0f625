"""The book's tooling: figures, pages, student copies, the exercises' checkers.

    plots, plots_results, plots_ablations, plots_reasoning   the figures
    knobs         sliders that redraw a chapter's figure
    narrative     result sentences chosen from the numbers
    results_page  the book's results page, from a run's files
    results_chapters  chapters 9-11's lines and tables on the results pages
    student       student copies of the chapters (solutions become stubs)
    build         `python -m labkit.book.build`: execute a chapter, check the built HTML offline
    exercises     each chapter's checkers and predict-then-run reveals

May import: lab, task, config, models, train, grpo, eval, studies.
"""
