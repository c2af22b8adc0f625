"""Evaluating a policy, and comparing two of them on the same problems and seeds.

    evaluate       the policy's test evaluation (greedy and sampled), not its best sample
    paired         paired tests between two policies
    agreement      do the samplers give the same rollouts?
    difficulty     accuracy by difficulty bin
    baselines      chance baselines: answers that never read the statement
    think_profile  how often a policy works a problem out, per number of movements (chapter 11)

May import: lab, task, config, models, train, grpo.
"""
