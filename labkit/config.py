"""The lab's settings, in one home: one frozen, typed configuration per preset, and the settings of
the runs that are not a preset's (the tiny base's two phases, the format base, the learned verifier).

Every count, limit, tolerance and batch size of the protocol is a field here, with a one-line
docstring; both presets share them all except the architecture and the learning rates, and each
difference is stated here with its reason.  Modules read their defaults from here, and every
random stream's seed offset from `SEED_OFFSETS` / `FIXED_SEEDS` / `CORPUS_SEED`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields, replace

from .task import problems


@dataclass(frozen=True)
class Architecture:
    """A Qwen2 architecture the lab builds itself (the tiny preset's; qwen's is the published one)."""

    vocab_size: int
    """embedding rows; more than the tokenizer's tokens, as in Qwen, so undecodable ids are real"""
    hidden_size: int
    """width of the residual stream"""
    intermediate_size: int
    """width of each MLP"""
    num_hidden_layers: int
    """transformer blocks"""
    num_attention_heads: int
    """query heads per block"""
    num_key_value_heads: int
    """key/value heads per block (grouped-query attention)"""
    max_position_embeddings: int
    """longest position the rotary embedding is set up for"""
    rope_theta: float
    """rotary embedding base"""
    rms_norm_eps: float
    """RMSNorm epsilon"""
    tie_word_embeddings: bool
    """output head shares the embedding (Qwen2Config's default is untied; Qwen2.5-0.5B ties)"""
    attention_dropout: float
    """non-zero so that chapter 2's "dropout left on" bug is real (Qwen2.5 has 0.0: latent there)"""


@dataclass(frozen=True)
class PresetConfig:
    """Every number of the protocol for one preset; book/protocol.md gives the reasons."""

    name: str
    """"qwen" or "tiny"; names the runs' folder, runs/<name>/"""
    # -- model ---------------------------------------------------------------
    qwen_revision: str | None
    """Hugging Face revision of the qwen weights (None for tiny, which the lab pretrains)"""
    architecture: Architecture | None = None
    """the architecture the lab builds (tiny); None for qwen, whose config.json is checked on load"""
    # -- sequence limits (both presets) ----------------------------------------
    max_prompt_tokens: int = 256
    """longest chat prompt, in tokens; a longer statement is refused"""
    max_new_tokens: int = 64
    """generation stops here (finish_reason "length") if no EOS came"""
    max_total_tokens: int = 320
    """prompt + response, the longest row any batch holds"""
    # -- warm start and SFT ------------------------------------------------------
    warm_start_examples: int = problems.WARM_START_SIZE
    """the warm start's examples: all 128 of the task's warm-start set (a shortened run takes its first ones)"""
    warm_start_epochs: int = 3
    """128 / 8 x 3 = 48 updates"""
    sft_examples: int = problems.SPLIT_SIZES["train"] - problems.WARM_START_SIZE
    """the other 872 train problems, the task's pool (the additional SFT, the supervised reference)"""
    sft_epochs: int = 2
    """ceil(872 / 8) x 2 = 218 updates"""
    sft_batch_size: int = 8
    """examples per SFT update"""
    sft_lr: float = 2e-5
    """peak SFT learning rate (warm-up then linear decay)"""
    sft_weight_decay: float = 0.0
    """AdamW's decoupled weight decay in SFT"""
    validation_batch_size: int = 50
    """validation examples per forward when measuring the NLL (a memory bound; changes no number)"""
    # -- GRPO ------------------------------------------------------------------
    grpo_iterations: int = 100
    """iterations of sample-then-update"""
    prompts_per_iteration: int = 4
    """P prompts per iteration, from a seeded permutation of the 872-problem pool"""
    G: int = 4
    """G responses per prompt; the advantages compare them"""
    updates_per_iteration: int = 2
    """updates on the same rollouts (with 1, rho = 1 and the clip never acts)"""
    clip_eps: float = 0.2
    """rho is clipped to [1 - clip_eps, 1 + clip_eps]"""
    kl_coef: float = 0.02
    """weight of the exact per-prefix KL to the frozen reference"""
    kl_block_size: int = 4096
    """vocabulary entries per block of the exact KL (a memory bound; changes no number)"""
    grpo_lr: float = 1e-6
    """peak GRPO learning rate (warm-up then linear decay)"""
    grpo_weight_decay: float = 0.01
    """AdamW's decoupled weight decay in GRPO"""
    grad_clip: float = 1.0
    """gradient norm clip, SFT and GRPO"""
    warmup_fraction: float = 0.1
    """share of the updates spent warming the rate up linearly from 0"""
    final_lr_fraction: float = 0.1
    """the rate decays linearly to this share of its peak"""
    advantage_eps: float = 1e-8
    """A = (r - mean) / (std + advantage_eps): a constant group gets A = 0, not a division by 0"""
    logprob_check_tol: float = 2e-4
    """largest |teacher-forced - recorded| old log-prob the pre-update check accepts"""
    # -- evaluation ----------------------------------------------------------------
    eval_draws: int = 4
    """seeded samples per test problem (per-draw success; best-of-4 reported apart)"""
    eval_batch_size: int = 100
    """fast-sampler rows per batch in evaluation and the sampler comparison (changes no token)"""
    # -- fixed-prompt checkpoint curves (labkit.grpo.checkpoint_curves) ------------------
    checkpoint_every: int = 10
    """iterations between a GRPO run's fixed-prompt checkpoints (also at its start and end); 0: none"""
    checkpoint_problems: int = 64
    """validation problems in the fixed set (a seeded choice; the validation split only)"""
    checkpoint_draws: int = 4
    """seeded samples per fixed problem, the same seeds at every checkpoint"""
    # -- seeds -----------------------------------------------------------------------
    seed: int = 1234
    """the run seed; each generator (data order, prompts, sampling) is seeded apart from it (SEED_OFFSETS)"""

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
    # About 1M parameters (book/protocol.md, "Model and sequences"); 512 embedding rows for the tokenizer's 494 tokens.
    architecture=Architecture(vocab_size=512, hidden_size=128, intermediate_size=512, num_hidden_layers=4,
                              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                              rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
                              attention_dropout=0.1),
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

# Every random stream of the runs is seeded `config.seed + offset`, each with an offset of its own,
# so that no two streams are the same; one table, so that a new stream is given an offset apart
# from all the others.
SEED_OFFSETS = {
    "warm_start_data_order": 101,  # labkit.train.sft: the warm start's permutations of its 128 examples
    "sft_data_order": 202,  # labkit.train.sft: the additional SFT's permutations of its 872 examples
    "grpo_prompt_order": 303,  # labkit.grpo.loop: the permutations of the 872-problem pool
    "grpo_generation": 404,  # labkit.grpo.loop: the sampling seeds of the rollouts
    "random_reward": 505,  # labkit.grpo.variants: the random-reward control's Bernoulli draws
    "group_size_validation_draws": 808,  # labkit.studies.group_size: the seeds of its validation draws
}
# Streams seeded with a fixed number, not from config.seed (they are not part of a preset's runs).
FIXED_SEEDS = {
    "reward_model": 4242,  # labkit.studies.reward_model: the global RNGs before its sampling (each response has its own hashed seed)
    "tuning_validation_draws": 4242,  # labkit.studies.tuning: the validation draws that compare learning rates
}


# --- The settings of the lab's other runs: the tiny base's two phases, the format base, the learned verifier ---
# (one preset each: the qwen preset starts from the published model and never pretrains.)

# labkit.train.corpus: the pretraining corpus's document stream; every phase's own stream is an offset of it
CORPUS_SEED = 31_415


@dataclass(frozen=True)
class AnswerPhaseConfig:
    """The tiny base's second phase (labkit.train.answer_phase): statements and their answers, loss on the answers."""

    steps: int = 12000
    """answer-phase updates: about 50-60 minutes on one CPU thread (~0.25-0.3 s a step)"""
    documents_per_step: int = 32
    """statement-and-answer documents per update"""
    peak_lr: float = 2e-3
    """the cosine's peak rate (schedule.warmup_cosine)"""
    final_lr: float = 4e-4
    """the rate the cosine ends at, at update `steps` (a rate, not a share: see warmup_cosine)"""
    warmup_steps: int = 50
    """updates of linear warm-up before the cosine"""
    weight_decay: float = 0.01
    """AdamW's decoupled weight decay"""
    beta1: float = 0.9
    """AdamW's first-moment decay"""
    beta2: float = 0.95
    """AdamW's second-moment decay"""
    grad_clip: float = 1.0
    """gradient norm clip of each update"""
    keyed_share: float = 0.5
    """share of documents that ask for a JSON object with a named key (the rest: corpus direct answers)"""
    seed: int = CORPUS_SEED + 100
    """seed of this phase's own stream of direct documents (never the corpus phase's)"""
    probe_seed: int = CORPUS_SEED + 200
    """seed of the held-out statements whose exact answers are measured (never trained on)"""
    probe_documents: int = 512
    """held-out statements in the probe"""
    eval_every: int = 500
    """updates between two probe measurements (the "eval" rows of log.jsonl)"""
    log_every: int = 100
    """updates between two "train" rows of log.jsonl (the mean loss since the last one)"""
    state_every_s: float = 180.0
    """seconds between two resumable states"""


@dataclass(frozen=True)
class PretrainConfig:
    """The tiny base's pretraining (labkit.train.pretrain): the corpus phase, then `answer`, the answer phase."""

    seed: int = 0
    """initialises the model (the corpus has its own seed)"""
    corpus_seed: int = CORPUS_SEED
    """seeds the corpus's document stream (labkit.train.corpus)"""
    steps: int = 12000
    """corpus-phase updates: about 30-40 minutes on one CPU thread (~0.16-0.2 s a step)"""
    rows_per_step: int = 4
    """packed rows per update"""
    row_tokens: int = 256
    """4 rows x 256 tokens = 1,024 token slots per update: more updates for the same compute"""
    peak_lr: float = 3e-3
    """the cosine's peak rate (schedule.warmup_cosine)"""
    warmup_steps: int = 200
    """updates of linear warm-up before the cosine"""
    final_lr_fraction: float = 0.1
    """the cosine ends at this share of the peak, at update `steps`"""
    weight_decay: float = 0.01
    """AdamW's decoupled weight decay"""
    beta1: float = 0.9
    """AdamW's first-moment decay"""
    beta2: float = 0.95
    """AdamW's second-moment decay (0.95, not 0.999: the usual choice for language-model pretraining)"""
    grad_clip: float = 1.0
    """gradient norm clip of each update"""
    log_every: int = 100
    """updates between two lines of corpus_log.jsonl (the mean loss since the last one)"""
    heldout_every: int = 1000
    """updates between two held-out measurements (loss and answer accuracy)"""
    heldout_rows: int = 16
    """packed rows of the held-out stream scored at each measurement"""
    heldout_seed: int = CORPUS_SEED + 1
    """a second stream of the same corpus (also free of dataset problems), never trained on"""
    probe_documents: int = 256
    """held-out direct answers (from seed heldout_seed + 1) whose teacher-forced accuracy is logged"""
    threads: int = 1
    """torch CPU threads: 1 makes the pretraining deterministic (and the committed base reproducible)"""
    answer: AnswerPhaseConfig = AnswerPhaseConfig()
    """the second phase (labkit.train.answer_phase): dense answer-only practice on statements"""


@dataclass(frozen=True)
class FormatBaseConfig:
    """The continued pretraining that seeds the lab's format into the base."""

    max_steps: int = 400
    """at most this many updates of `documents_per_step` documents"""
    stop_at_valid_share: float = 0.05
    """stop at the first measurement where this share of answers is valid lab format: rare, not absent"""
    documents_per_step: int = 32
    """documents per update (the answer phase's count)"""
    lab_format_share: float = 0.02
    """share of documents in the lab's exact prompt and answer format"""
    keyed_share: float = 0.5
    """of the other documents, the share with another JSON key (the answer phase's mix)"""
    lr: float = 2e-5
    """constant and low: at 4e-4 (the answer phase's last) 2% of documents taught the format to 97% of
    answers within 50 updates, which is a base that already has the behaviour, not one that rarely shows it"""
    weight_decay: float = 0.01
    """AdamW's decoupled weight decay (the base's pretraining value)"""
    beta1: float = 0.9
    """AdamW's first-moment decay (the base's pretraining value)"""
    beta2: float = 0.95
    """AdamW's second-moment decay (the base's pretraining value)"""
    grad_clip: float = 1.0
    """gradient norm clip of each update"""
    seed: int = CORPUS_SEED + 300
    """this phase's own document stream (never the corpus or answer phases' seeds)"""
    measure_every: int = 10
    """updates between two measurements of the valid-format share (the stopping rule reads them)"""
    measure_draws: int = 4
    """temperature-1 answers per validation problem at each measurement"""
    log_every: int = 10
    """updates between two lines of the log"""


@dataclass(frozen=True)
class RewardModelConfig:
    """How the learned verifier is made (the same for every preset; tiny is the one cached)."""

    draws_per_problem: int = 2
    """temperature-1 responses per train problem and policy (2 x 1,000 x 2 policies = 4,000)"""
    held_out_share: float = 0.2
    """share of train problems whose responses are kept for measuring precision and recall"""
    l2: float = 1e-3
    """penalty on the weights (not the bias) of the logistic regression, per response"""
    newton_steps: int = 50
    """at most this many Newton steps; it stops when a step moves the parameters by < 1e-12"""
    threshold: float = 0.5
    """p(correct) at or above which the proxy says 1"""
    seed: int = FIXED_SEEDS["reward_model"]
    """seeds the global RNGs before sampling (each response's own seed is `sample_seed`'s)"""


def get_preset(name: str) -> PresetConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; expected one of {sorted(PRESETS)}")
    return PRESETS[name]


# -- Chapter 11: the thinking bases and the GRPO runs on worked answers --------------------------------


@dataclass(frozen=True)
class ThinkingPhase:
    """One continued pretraining: from `start` ("committed" or another base's name), `steps` updates."""

    name: str
    start: str
    steps: int
    thinking_share: float
    """of the worked-prompt documents, the share answered with working (the rest: the object alone)"""
    peak_lr: float
    final_lr: float


@dataclass(frozen=True)
class ThinkingBaseConfig:
    """How chapter 11's thinking bases are made (`labkit.studies.thinking_base`; one config, the phases below)."""

    worked_prompt_share: float = 0.5
    """share of documents in the worked prompt (working or direct, as the phase says); the rest are the
    base's own answer-phase documents"""
    rows_per_step: int = 8
    """packed rows per update (8 x 384 = 3,072 token slots)"""
    row_tokens: int = 384
    """tokens per packed row: more than the longest document (a worked answer to eight movements at OOD
    magnitudes, with its prompt, takes up to about 260), which `pretrain.pack_rows` could never place"""
    warmup_steps: int = 50
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    seed: int = CORPUS_SEED + 400
    """the documents' stream (never the corpus, answer-phase or format-base seeds); each phase adds its index"""
    measure_every: int = 200
    """updates between two measurements on the validation chains"""
    profile_draws: int = 8
    """temperature-1 answers per test chain in the final profile (pass@k up to 8 from the same rows)"""
    phases: tuple[ThinkingPhase, ...] = (
        ThinkingPhase("skill", "committed", 3000, 1.0, 3e-3, 3e-4),
        ThinkingPhase("rare_0", "skill", 300, 0.0, 3e-4, 3e-4),
        ThinkingPhase("rare_2", "skill", 300, 0.02, 3e-4, 3e-4),
        ThinkingPhase("rare_10", "skill", 300, 0.10, 3e-4, 3e-4),
        ThinkingPhase("control", "committed", 300, 0.0, 3e-4, 3e-4),
    )

    def phase(self, name: str) -> ThinkingPhase:
        for p in self.phases:
            if p.name == name:
                return p
        raise ValueError(f"unknown thinking base {name!r}; expected one of {[p.name for p in self.phases]}")


@dataclass(frozen=True)
class ReasoningConfig:
    """The budget of every chapter 11 GRPO run (`labkit.studies.reasoning`; the same for all, so that they are
    compared on equal terms)."""

    prompts_per_iteration: int = 16
    G: int = 8
    iterations: int = 40
    lr: float = 1e-4
    measure_every: int = 10
    """iterations between two think profiles on the validation chains (and one before the first)"""
    profile_draws: int = ThinkingBaseConfig.profile_draws
    """temperature-1 answers per test chain in the final profile (the bases' own number: paired draws)"""
    train_chains_per_k: int = 100
    """train chains drawn per k for GRPO's pool (800 in all), none in any base's documents"""
