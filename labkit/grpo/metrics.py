"""Every name the lab writes into a log, a history or a results file, documented once.

Names follow the trainers' where one exists (TRL's GRPO logs: `reward`, `reward_std`,
`frac_reward_zero_std`, `completions/mean_length`, `completions/clipped_ratio`, `kl`, `entropy`,
`clip_ratio/*`); a namespace (`completions/`, `clip_ratio/`, `ratio/`, `logprob_check/`) groups
the figures of one thing.  The same quantity has the same name everywhere: `valid_json`,
`success_rate` and `without_eos` mean the same in an SFT validation, a GRPO iteration and the
evaluation.  tests/test_metrics.py checks that every key the lab writes is documented here: GRPO,
SFT, the evaluation, the base's two pretraining phases, the format base and the learned verifier.
"""

from __future__ import annotations

# One GRPO iteration (history.json, one record per iteration).
GRPO_ITERATION = {
    "iteration": "1-based index of the iteration",
    "problem_ids": "the P pool problems of the iteration, in prompt order",
    "reward": "mean verifier (true) reward over the P x G rollouts, whatever reward the run optimises",
    "optimised_reward": "mean reward the run optimises (the verifier's in the protocol; a variant's control "
                        "or length penalty otherwise: labkit.grpo.variants)",
    "optimised/frac_reward_zero_std": "share of groups whose optimised rewards are all equal (no signal)",
    "reward_std": "mean over the P groups of the group's reward standard deviation (population, ddof 0)",
    "frac_reward_zero_std": "share of groups whose G rewards are all equal: no signal, zero advantages",
    "valid_json": "share of responses whose text is a schema-valid answer (verifier Verdict.valid)",
    "completions/mean_length": "mean response length in tokens, EOS included",
    "completions/clipped_ratio": "share of responses cut at the token limit (finish_reason 'length')",
    "logprob_check/max_abs_diff": "pre-update check: largest |teacher-forced - recorded| old log-prob over the "
                                  "iteration's tokens (must be <= logprob_check_tol)",
    "updates": "one GRPO_UPDATE record per update of the iteration",
    "kl": "from the iteration's last update (see GRPO_UPDATE)",
    "entropy": "from the iteration's last update",
    "grad_norm": "from the iteration's last update",
    "learning_rate": "from the iteration's last update",
    "clip_ratio/low_mean": "from the iteration's last update",
    "clip_ratio/high_mean": "from the iteration's last update",
    "clip_ratio/region_mean": "from the iteration's last update",
}

# Written into an iteration's record only by the variants that switch them on (labkit.grpo.variants); the
# protocol's records never hold them.
GRPO_ITERATION_VARIANTS = {
    "sampler_mismatch": "a sampler whose weights differ from the trainer's on purpose (sampler_weights bfloat16 or "
                        "float8, or logp_old from the trainer): the pre-update check's mean_abs_diff and "
                        "max_abs_diff, and with truncated importance sampling tis_weight_mean (mean weight over "
                        "response tokens) and tis_capped (share of tokens whose weight the cap set)",
    "dynamic_sampling": "DAPO's dynamic sampling: rounds (extra draws of P prompts), prompts_drawn, "
                        "groups_with_signal, silent_kept (groups with no signal kept to fill the batch)",
    "overlong_filtered": "DAPO's overlong filtering: responses stopped by the token limit, taken out of the loss",
}

# One GRPO update (history.json, record["updates"][k]).
GRPO_UPDATE = {
    "loss": "surrogate + kl_coef x kl, the value backpropagated",
    "surrogate": "clipped surrogate loss, token -> response -> prompt means (negated objective)",
    "kl": "exact per-prefix KL(current || reference) over the vocabulary, same reduction",
    "kl_k3": "the k3 estimator of the KL on the sampled tokens, same reduction (logged, not optimised)",
    "entropy": "mean token entropy of the current policy, same reduction",
    "clip_ratio/low_mean": "share of response tokens with A < 0 and rho < 1 - clip_eps (clipped below)",
    "clip_ratio/high_mean": "share of response tokens with A > 0 and rho > 1 + clip_eps (clipped above)",
    "clip_ratio/region_mean": "low + high: share of tokens whose gradient the clip removed",
    "ratio/mean": "mean of rho = exp(logp_current - logp_old) over response tokens",
    "ratio/min": "smallest rho",
    "ratio/max": "largest rho",
    "grad_norm": "gradient norm before clipping to grad_clip",
    "learning_rate": "the schedule's rate for this update",
}

# One GRPO iteration's wall times (timings.jsonl.gz; evidence only, never compared).
GRPO_TIMINGS = {
    "iteration": "1-based index of the iteration",
    "generation": "seconds sampling the P x G responses (and verifying them)",
    "logprob_check": "seconds comparing the recorded log-probs (its forward is the first update's)",
    "optimisation": "seconds of the reference forward and the updates, the check excluded",
    "iteration_total": "seconds of the whole iteration",
    "rollout_seconds": "each rollout's generation seconds, in the rows' order (a batched sampler: its batch's "
                       "time shared evenly)",
    "checkpoint": "seconds of the fixed-prompt checkpoint measured after the iteration (0.0: none was due)",
}

# One fixed-prompt checkpoint of a GRPO run (checkpoints.jsonl; labkit.grpo.checkpoint_curves).
GRPO_CHECKPOINT = {
    "iteration": "iterations done when the policy was measured (0: the start, before any update)",
    "greedy_success": "share of the fixed validation problems whose greedy answer has reward 1",
    "sampled_success": "share of the fixed draws (the same seeds at every checkpoint) with reward 1",
    "sampled_valid_json": "share of the fixed draws that are schema-valid answers",
    "entropy": "mean token entropy of the policy on its fixed draws, token -> response -> prompt means",
    "kl": "exact per-prefix KL(policy || reference) on the fixed draws, the same reduction",
    "problems": "fixed validation problems measured (config checkpoint_problems)",
    "draws": "seeded draws per problem (config checkpoint_draws)",
    "greedy_correct": "per problem, in the fixed order: 1 if its greedy answer has reward 1, else 0",
    "draws_correct": "per problem, in the fixed order: how many of its draws have reward 1",
}

# One rollout (rollouts.jsonl.gz, one row per response).
ROLLOUT_ROW = {
    "rollout_id": "unique id: g<G>-it<iteration-1>-<problem_id>-<j> (-r<k> after the problem id for its k-th "
                  "repeat within one iteration)",
    "iteration": "1-based iteration that sampled and optimised it",
    "problem_id": "the pool problem answered",
    "seed": "the response's own sampling seed",
    "prompt_length": "prompt tokens",
    "response_ids": "generated token ids, EOS included when emitted",
    "text": "decoded response (EOS removed)",
    "finish_reason": "'eos' or 'length'",
    "tokenization_valid": "False if an id is outside the tokenizer",
    "logp_old": "log-prob of each generated id under the sampling (old) policy, recorded at sampling",
    "reward": "verifier reward, 1 for complete, valid and correct",
    "optimised_reward": "the reward the run optimised for this response (= reward in the protocol)",
    "reason": "verifier reason when the reward is 0, else None",
    "advantage": "(r - group mean) / (group std + eps)",
    "policy_digest": "parameter digest of the policy that sampled",
    "sampler": "'reference' or 'fast'",
}

# One SFT update (history.json["updates"]).
SFT_UPDATE = {
    "update": "1-based index of the update",
    "epoch": "1-based epoch",
    "example_ids": "the batch's examples",
    "learning_rate": "the schedule's rate for this update",
    "loss": "cross-entropy summed over the batch's supervised tokens / their number",
    "grad_norm": "gradient norm before clipping to grad_clip",
    "response_tokens": "supervised tokens of the batch (EOS included)",
    "tokens": "all non-pad tokens of the batch",
}

# One SFT validation (history.json["validation"], manifest "validation_nll").
SFT_VALIDATION = {
    "epoch": "0 before training, then after each epoch",
    "nll": "per-token negative log-likelihood of the validation targets",
    "tokens": "target tokens scored",
    "examples": "validation examples scored",
}

# A greedy validation of an SFT branch (manifest "validation_greedy", "start_validation_greedy").
GREEDY_VALIDATION = {
    "sampler": "'fast' or 'reference'",
    "problems": "validation problems answered",
    "correct": "responses with reward 1",
    "success_rate": "correct / problems (greedy pass@1)",
    "valid_json": "share of responses that are schema-valid answers",
    "without_eos": "responses that hit the token limit without emitting EOS (count)",
    "mean_response_tokens": "mean generated tokens per response",
    "reasons": "responses per verifier reason (those with reward 0)",
}

# Every name of the evaluation's results.json (labkit.eval.evaluate).
EVALUATION = {
    "responses": "responses scored (greedy: 1 per problem; sample: 4 per problem), invalid ones included",
    "problems": "distinct test problems among those responses",
    "correct": "responses with reward 1 (complete, valid, correct)",
    "success_rate": "correct / responses; greedy: greedy pass@1; sample: per-draw success over all samples, "
                    "never best-of-4",
    "valid_json": "fraction of responses whose text is a schema-valid answer (verifier Verdict.valid: one JSON "
                  "object, one integer field final_stock in 0..300), whatever the EOS, token ids or target",
    "valid_json_responses": "the count behind valid_json",
    "without_eos": "responses that hit the token limit without emitting EOS (count)",
    "without_eos_rate": "without_eos / responses",
    "mean_response_tokens": "mean generated tokens per response, EOS included when emitted",
    "reasons": "responses per verifier outcome: 'correct' and every reason of verifier.REASONS (0 included); "
               "they sum to responses",
    "*_ci": "Wilson 95% interval [low, high] of the rate beside it (a binomial proportion over the responses, "
            "or over the problems for best-of-k)",
    "pass_at_k": "sample mode: unbiased pass@k (Chen et al. 2021), mean over problems of 1 - C(n-c,k)/C(n,k), "
                 "with its exact sampling budget",
    "best_of_4_not_pass_at_1": "sample mode: fraction of problems with at least one correct sample among 4 "
                               "(= pass@4); an inflated number when reported as pass@1",
}

# The tiny base's pretraining, corpus phase (runs/tiny/base/corpus_log.jsonl; labkit.train.pretrain).  Its
# names are frozen with the committed base: renaming one is a change of pretrain.py, so a
# re-pretraining; `lr` is what the other logs call learning_rate, `elapsed_s` a time in seconds.
PRETRAIN_CORPUS_LOG = {
    "step": "updates done (0: before the first)",
    "lr": "the cosine schedule's rate of the last update (learning_rate elsewhere)",
    "loss": "mean next-token cross-entropy over the last log_every updates",
    "grad_norm": "gradient norm before clipping, of the last update",
    "tokens": "trained tokens so far (drawn operands excluded)",
    "elapsed_s": "seconds since the phase began",
    "heldout_loss": "cross-entropy on the held-out stream of the corpus (never trained on)",
    "answer_accuracy": "share of held-out direct answers whose digits are all right, teacher-forced",
}

# The tiny base's pretraining, answer phase (runs/tiny/base/log.jsonl; labkit.train.answer_phase): a
# "train" row every log_every updates and an "eval" row every eval_every.  Frozen as above.
PRETRAIN_ANSWER_LOG = {
    "kind": "'train' or 'eval'",
    "step": "answer-phase updates done (0: its start, after the corpus phase)",
    "lr": "the cosine schedule's rate of the last update (learning_rate elsewhere)",
    "loss": "mean cross-entropy on the answers over the last log_every updates",
    "minutes": "minutes since the pretraining (both phases) began",
    "exact": "share of held-out probe statements whose greedy answer digits are all right, teacher-forced",
    "digits": "per answer digit position (labkit.train.answer_phase.digit_accuracy): share of probe answers right there",
}

# The format base's continued pretraining (runs/tiny/format_base/log.json; labkit.studies.format_base): a
# "train" row every log_every updates and a "measure" row every measure_every.
FORMAT_BASE_LOG = {
    "kind": "'train' or 'measure'",
    "step": "updates done (0: before the first)",
    "loss": "mean cross-entropy over the last log_every updates",
    "lab_format_documents": "documents in the lab's exact format seen so far",
    "valid": "share of the measured temperature-1 answers that are schema-valid (valid_json elsewhere)",
    "correct": "share of the measured answers with reward 1 (success_rate elsewhere)",
    "responses": "answers measured (validation problems x measure_draws)",
}

# The learned verifier's fit (runs/<preset>/reward_model/history.json; labkit.studies.reward_model), one row
# per Newton step.
REWARD_MODEL_FIT = {
    "step": "1-based Newton step",
    "loss": "penalised logistic loss after the step",
    "step_norm": "norm of the step H^-1 g (the fit stops below 1e-12)",
    "grad_norm": "norm of the loss's gradient before the step",
}

# One labelled response of the learned verifier (runs/<preset>/reward_model/samples.jsonl.gz).
REWARD_MODEL_SAMPLE = {
    "policy": "the policy that wrote the response ('warm_start' or 'sft')",
    "problem_id": "the train problem answered",
    "draw": "0-based draw of the problem",
    "seed": "the response's own sampling seed",
    "response_ids": "generated token ids, EOS included when emitted",
    "text": "decoded response (EOS removed)",
    "finish_reason": "'eos' or 'length'",
    "label": "the verifier's reward: what the proxy learns to predict",
    "reason": "verifier reason when the label is 0, else None",
    "held_out": "True for a held-out problem (precision and recall are measured on those)",
    "features": "the judge's features of the response (labkit.studies.reward_model.FEATURES)",
    "p_correct": "the fitted proxy's probability that the response is correct",
    "proxy": "the proxy's yes/no: p_correct >= threshold",
}

ALL = {"grpo_iteration": GRPO_ITERATION, "grpo_update": GRPO_UPDATE, "grpo_timings": GRPO_TIMINGS,
       "grpo_checkpoint": GRPO_CHECKPOINT,
       "rollout_row": ROLLOUT_ROW, "sft_update": SFT_UPDATE, "sft_validation": SFT_VALIDATION,
       "greedy_validation": GREEDY_VALIDATION, "evaluation": EVALUATION,
       "pretrain_corpus_log": PRETRAIN_CORPUS_LOG, "pretrain_answer_log": PRETRAIN_ANSWER_LOG,
       "format_base_log": FORMAT_BASE_LOG, "reward_model_fit": REWARD_MODEL_FIT,
       "reward_model_sample": REWARD_MODEL_SAMPLE}


def undocumented(keys, table: dict) -> list[str]:
    """The keys a table does not document (`*_ci` covers every name ending in _ci)."""
    return sorted(k for k in keys if k not in table and not (k.endswith("_ci") and "*_ci" in table))
