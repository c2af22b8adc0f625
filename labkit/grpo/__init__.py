"""The GRPO step: the maths of the objective and the loop that runs it.

    losses             advantages, the clipped surrogate, the exact KL, the reductions (chapters 3-5)
    objectives         GRPO, Dr. GRPO, DAPO, GSPO, CISPO as their papers write them
    variants           the objective's switches, as tables, resolved once into what the loop uses
    metrics            every name the lab logs, documented once
    core               one iteration: sample, score, advantages, the objective, the update
    tasks              what a run asks of the task it learns (its pool, verifier, reward, records)
    loop               the run around the iterations, for every task: its folder, states, autosave,
                       Ctrl-C, resume
    checkpoint_curves  the policy on fixed validation prompts at checkpoints of a run

May import: lab, task, config, models, train.

One iteration, in reading order (about 680 lines in core.py, losses.py and variants.py; `python
tests/reading_path.py` lists every function on the path):

    core.run_iteration                  the iteration: sample, update, record
    core.sample_iteration               the next P prompts (core.draw_prompts), G responses each by the
                                        old policy (models.sampling.sample_groups, read by its docstring),
                                        each scored by the verifier; the rewards (resolved.optimised_reward)
    losses.group_advantages             A = (r - mean) / (std + eps) per group; exactly 0 in a group whose
                                        rewards are all equal (losses.zero_variance_groups)
    core.update_iteration               one batch, the frozen reference's scores once (core.reference_scores),
                                        the updates; the pre-update check on the first update's forward
                                        (models.sampling.compare_with_recorded)
    core.grpo_update                    one forward of the current policy, the loss, one clipped AdamW step
                                        (train.schedule.clipped_step)
    core.grpo_loss                      the objective's term + kl_coef x the KL term
    losses.clipped_surrogate            min(rho A, clip(rho) A) per token, reduced token -> response ->
                                        group (losses.reduce_tokens); it refuses a gradient into logp_old
    variants.exact_kl_term              the exact per-prefix KL over the vocabulary (losses.exact_prefix_kl,
                                        blockwise, with its own backward)
    core.record_iteration               the iteration's log record (core.iteration_metrics) and its rollouts
"""
