"""labkit: the small library behind the GRPO course lab.

Its units sit in one order; each imports only from itself and the units above it in this list
(tests/test_layers.py checks it, late imports included, and that no chain of imports comes back;
`python tests/test_layers.py` prints the graph):

    lab/       run folders, digests, resumable states, the cache's records, runtime, memory
    task/      StockArithmetic-v1: problems, the verifier, the data files, worked answers
    config     every setting: one frozen, typed config per preset, the other runs' settings
    models/    the two presets, the tokenizer, prompts and log-probs, the samplers
    train/     schedules and the update step, the tiny base's pretraining, the warm start and SFT
    grpo/      the GRPO step: losses, objectives, variants, metrics, the loop
    eval/      evaluating a policy, paired tests, profiles
    studies/   each chapter's experiments, built on the units above
    book/      figures, pages, student copies, the exercises' checkers
    commands   cli (`python -m labkit`), pipeline, steps (the cached run's step graph), fill (local models rebuilt and
               checked), live (chapter 6's run, replayed live), smoke, bench

One GRPO iteration, in reading order (labkit/grpo/__init__.py says more):
grpo/core.py `run_iteration` samples with models/sampling.py, scores with task/verifier.py, takes
group advantages, and updates with grpo/losses.py's clipped surrogate and exact KL.

What the chapters import, module by module (tests/test_public_names.py keeps this list and the notebooks
equal):

    labkit.lab       runs
    labkit.task      problems, verifier, data, worked
    labkit.config
    labkit.live
    labkit.models    presets, scoring, rollouts, sampling
    labkit.train     schedule, adam_step, corpus, answer_phase, sft
    labkit.grpo      core, loop, losses, objectives, variants
    labkit.eval      evaluate, paired, agreement, difficulty, baselines, think_profile
    labkit.studies   ablations, group_size, larger_run, sweep, kl_gradients, format_base, reward_model,
                     overoptimisation, overoptimisation_summary, thinking_base, reasoning, reasoning_report,
                     reasoning_sweep, skill_test, crossover, rarer_bases
    labkit.book      plots, plots_ablations, plots_reasoning, knobs, narrative, exercises
"""

__version__ = "0.1.0"
