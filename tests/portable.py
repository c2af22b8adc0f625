"""Which unit tests `make test-slow` runs a second time under PyTorch's portable kernels (see conftest.py).

A module of its own, with no imports, so that tests/phases.py can name these files on the portable
pass's command line (pytest then collects only them) without importing torch.
"""

PORTABLE_FILES = {
    # stored values, recomputed with torch: the committed run's models, evaluations, snapshots and proxies
    "test_grpo_snapshot.py", "test_evaluate.py", "test_metrics.py", "test_models.py", "test_reward_model.py",
    "test_format_base.py", "test_agreement.py", "test_overoptimisation.py",
    # two implementations of one function, compared within a tolerance
    "test_losses.py", "test_sampling.py", "test_scoring.py", "test_shared_prompt.py", "test_static_sampler.py",
    "test_state.py",
}
PORTABLE_TESTS = {  # single tests of files that mostly run processes against themselves
    "test_sweep.py": {"test_the_committed_sweep_is_complete_for_this_code",
                      "test_the_committed_chapter10_sweep_is_complete_and_rescored_exactly"},
}
# Files that compare stored values too, but with NumPy, SciPy or plain Python only (the results page, the
# paired tests, the difficulty tables, chapter 7's and 10's figures): PyTorch's kernels cannot change their
# verdicts, so they run once.  conftest.py checks that they run no torch operation at all (a
# TorchDispatchMode around each test's set-up and call): one that starts to is a failure that says to list
# it in PORTABLE_FILES instead.
TORCH_FREE_FILES = {
    "test_cached_run.py", "test_results_page.py", "test_paired.py", "test_difficulty.py", "test_plots_ch07.py",
    "test_notebook_ch10.py", "test_notebook_ch11.py",
}
