"""The GRPO step: the maths of the objective and the loop that runs it.

    losses             advantages, the clipped surrogate, the exact KL, the reductions (chapters 3-5)
    objectives         GRPO, Dr. GRPO, DAPO, GSPO, CISPO as their papers write them
    variants           the objective's switches, as tables, resolved once into what the loop uses
    metrics            every name the lab logs, documented once
    loop               one iteration (sample, score, advantages, the update, the pre-update check)
                       and the protocol's 100 of them
    checkpoint_curves  the policy on fixed validation prompts at checkpoints of a run

May import: lab, task, config, models, train.
"""
