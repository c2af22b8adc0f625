"""labkit: the small library behind the GRPO course lab.

Its modules sit on eight floors; each imports only from its own floor and the floors below it
(tests/test_layers.py checks it, and `python tests/test_layers.py` prints the graph):

    1 records:     runs (run folders, manifests, atomic writes, digests), cache (what made each cached
                   step), state (resumable states), runtime (seeds, determinism, environment), memory
    2 task:        task (StockArithmetic-v1: problems, solver, statements, splits), data (the committed
                   data files, phases kept apart), verifier (parse and score a response, with the exact
                   reason it is invalid), tokenizer, config (every setting: one typed config per
                   preset, the other runs' configs, the seeds)
    3 maths:       losses (advantages, clipped surrogate, exact KL, reductions), objectives (GRPO, Dr. GRPO,
                   DAPO, GSPO, CISPO as their papers write them; the outside checks' cases), schedule (learning
                   rates and the one update step), variants (the objective's switches, as tables),
                   metrics (every logged name, documented once)
    4 model:       models (load, build, digest), scoring (prompts, batches, log-probs), shared_prompt,
                   sampling and static_sampler (the two samplers), resume (the exact-resume check)
    5 evaluation:  evaluate (the policy, not its best sample), paired (paired tests), agreement
                   (reference vs fast sampler), difficulty, baselines, checkpoint_curves
    6 learning:    corpus, pretrain and answer_phase (the tiny base), format_base, sft (warm start and
                   SFT), grpo (the loop)
    7 studies:     group_size (chapter 8), larger_run, reward_model and overoptimisation (chapter 10),
                   overoptimisation_summary, sweep (chapter 9's variants), tuning (the tiny rates),
                   gradient_study (the policy-gradient identity, the gradient's noise: chapters 2-3),
                   ablations (one piece of GRPO removed per run, compared in pairs: chapters 3-8),
                   kl_gradients (the KL estimators as losses, against the exact KL's gradient),
                   think_profile, thinking_base and reasoning (chapter 11: the think profile, bases
                   that can work a problem out and rarely do, GRPO on worked answers from each)
    8 book:        plots, plots_results, plots_ablations, knobs, narrative, results_page, student, book,
                   exercises (their checkers, and the predict-then-run reveals),
                   bench, smoke, pipeline, cli
"""

__version__ = "0.1.0"
