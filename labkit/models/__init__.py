"""The models and what is done with them without training: load, prompt, score, sample.

    presets         the two presets (the tiny Qwen2 the lab pretrains, Qwen2.5-0.5B-Instruct): build,
                    load, save, digest
    tokenizer       the tiny preset's tokenizer
    scoring         prompt and response rows, masks, teacher-forced token log-probs
    shared_prompt   each GRPO prompt scored once for its group, not G times
    sampling        rollouts: the reference and fast samplers, reproducible Gumbel-max draws
    static_sampler  a third sampler with a preallocated KV cache

May import: lab, task, config.
"""
