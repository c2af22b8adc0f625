"""One frozen, typed configuration per preset.

Every count of the protocol is shared by both presets; only sizes and learning
rates differ, and each difference is stated here with its reason.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields, replace


@dataclass(frozen=True)
class PresetConfig:
    name: str
    # -- model ---------------------------------------------------------------
    qwen_revision: str | None
    """Hugging Face revision of the qwen weights (None for tiny, which the lab pretrains)."""
    # -- sequence limits (both presets) ----------------------------------------
    max_prompt_tokens: int = 256
    max_response_tokens: int = 64
    max_total_tokens: int = 320
    # -- warm start and SFT ------------------------------------------------------
    warm_start_examples: int = 128
    warm_start_epochs: int = 3  # 128 / 8 * 3 = 48 updates
    sft_examples: int = 872
    sft_epochs: int = 2  # ceil(872 / 8) * 2 = 218 updates
    sft_batch_size: int = 8
    sft_lr: float = 2e-5
    sft_weight_decay: float = 0.0
    # -- GRPO ------------------------------------------------------------------
    grpo_iterations: int = 100
    prompts_per_iteration: int = 4
    group_size: int = 4
    updates_per_iteration: int = 2
    clip_eps: float = 0.2
    kl_coef: float = 0.02
    kl_block_size: int = 4096
    grpo_lr: float = 1e-6
    grpo_weight_decay: float = 0.01
    grad_clip: float = 1.0
    warmup_fraction: float = 0.1
    final_lr_fraction: float = 0.1
    advantage_eps: float = 1e-8
    logprob_check_tol: float = 2e-4
    # -- evaluation ----------------------------------------------------------------
    eval_draws: int = 4
    # -- seeds -----------------------------------------------------------------------
    seed: int = 1234

    def fingerprint(self) -> str:
        """Short digest of every field: it names the runs made with this config."""
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    def to_dict(self) -> dict:
        return asdict(self)

    def with_overrides(self, **overrides) -> "PresetConfig":
        """A copy with some fields changed; an unknown key is an error."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(f"unknown config key(s) {unknown}; known keys: {sorted(known)}")
        return replace(self, **overrides)


QWEN = PresetConfig(name="qwen", qwen_revision="7ae557604adf67be50417f59c2c2f167def9a775")

# The tiny preset differs only in learning rates: a 1M-parameter model pretrained by the lab
# moves differently per step from a 0.5B instruct model, so its two rates are chosen on the
# VALIDATION split (never the test split) with `python -m labkit tune`, which runs the
# protocol's real budget at each rate.  The tables, as measured (200 validation problems;
# "sampled" = 4 seeded draws each at temperature 1; "signal" = groups of those 4 whose rewards
# are not all equal):
TINY = QWEN.with_overrides(
    name="tiny",
    qwen_revision=None,
    # Warm start from the committed base (46% exact answers in its own formats, 0% valid JSON in
    # the lab's: it writes the key its instruction names, never `final_stock`), 48 updates:
    #
    #   sft_lr   greedy   sampled   valid JSON (sampled)   signal
    #   1e-4     85.5%    55.5%     96.6%                  78%
    #   1.5e-4   87.0%    56.8%     98.6%                  76%
    #   2e-4     86.5%    56.0%     98.9%                  82%
    #   3e-4     78.5%    53.2%     99.4%                  76%
    #   5e-4     66.5%    49.6%     99.6%                  75%
    #   1e-3     20.5%    19.9%     99.9%                  40%
    #
    # Above 2e-4 the warm start forgets the base's arithmetic; below 1.5e-4 the format is less
    # reliable.  Chosen: the highest per-draw sampled success (what GRPO learns from) among the
    # rates whose samples are valid JSON at least 95% of the time.
    sft_lr=1.5e-4,
    # GRPO from that warm start (87.0% greedy, 56.8% sampled on validation), the full budget of
    # 100 iterations x 4 prompts x 4 responses, 2 updates each:
    #
    #   grpo_lr  greedy   sampled   valid JSON (sampled)   signal
    #   1e-5     92.0%    59.4%     99.5%                  76%
    #   2e-5     94.5%    59.9%     99.6%                  76%
    #   3e-5     95.0%    60.1%     99.9%                  75%
    #   5e-5     93.5%    59.2%     99.9%                  76%
    #   1e-4     82.0%    54.8%     99.8%                  78%
    #   2e-4     59.5%    47.2%     99.8%                  77%
    #
    # Chosen: the highest per-draw sampled success.  From 1e-5 to 5e-5 the sampled rates lie
    # within about one point of each other (800 draws: a 95% interval is about +-3.4 points),
    # so the choice among them is not resolved by validation; from 1e-4 up GRPO makes it worse.
    grpo_lr=3e-5,
)

PRESETS = {"qwen": QWEN, "tiny": TINY}


def get_preset(name: str) -> PresetConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; expected one of {sorted(PRESETS)}")
    return PRESETS[name]
