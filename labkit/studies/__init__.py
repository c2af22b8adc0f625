"""Each chapter's experiments, built on the units below; none of them is part of the protocol's core.

    gradient_study, kl_gradients             the policy-gradient identity, the gradient's noise, the KL
                                             estimators' gradients (chapters 2-5, appendix)
    ablations                                one piece of GRPO removed per run, compared in pairs
    group_size                               the group-size exercise (chapter 8)
    larger_run, tuning                       the larger run that moves the tiny policy; the tiny rates
    sweep                                    the objective's variants, run and cached (chapter 9)
    reward_model, format_base,               a learned verifier, a base that rarely answers in format,
    overoptimisation,                        reward over-optimisation on real runs (chapter 10)
    overoptimisation_summary
    thinking_base, reasoning,                bases that can work a problem out, GRPO on worked answers
    reasoning_report, skill_test,            (chapter 11), whether a base keeps the skill it never uses,
    crossover, reasoning_sweep,              pass@k up to 256 before and after RL, each piece of GRPO
    rarer_bases                              removed where RL works, bases rarer than rare_2

May import: lab, task, config, models, train, grpo, eval.
"""
