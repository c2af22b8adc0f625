"""The tiny preset's tokenizer: byte-level BPE built the way Qwen2's is.

NFC normalisation, Qwen2's pre-tokenizer split pattern (digits one at a time),
byte-level mapping, a ChatML chat template, and the three Qwen specials with
`<|im_end|>` as EOS.  The BPE merges are learned once from template text and
committed under `labkit/assets/tiny/`; `build_tiny_tokenizer` regenerates them.
"""

from __future__ import annotations

import random
from pathlib import Path

ASSET_DIR = Path(__file__).resolve().parents[1] / "assets" / "tiny"

# Qwen2's pre-tokenizer pattern (from its tokenizer.json): contractions, words,
# single digits, punctuation runs, newlines, spaces.
QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
BPE_VOCAB_SIZE = 512  # byte alphabet (256) + merges; the specials come after
# ChatML without Qwen's default system prompt: the tiny model never saw one.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _training_texts(seed: int = 0, count: int = 4000) -> list[str]:
    """Text to learn merges from: template words, numbers, JSON punctuation, chat markers.

    Numbers are random; the tokenizer learns spellings, not problems (digits are
    split one at a time, so no number becomes a token).
    """
    from ..task.problems import FORMAT_INSTRUCTION, ITEMS, TEMPLATES

    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        values = {k: rng.randint(0, 100) for k in ("initial", "d1", "d2", "w1", "w2")}
        texts.append(rng.choice(TEMPLATES).format(item=rng.choice(ITEMS), **values))
        texts.append(FORMAT_INSTRUCTION)
        texts.append('{"final_stock": %d}' % rng.randint(0, 300))
        texts.append("user\nassistant\nsystem\n")
    return texts


def build_tiny_tokenizer(out_dir: Path = ASSET_DIR):
    """Learn the BPE merges and save a `PreTrainedTokenizerFast` to `out_dir`."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_texts(), trainer)
    tok.add_special_tokens(list(SPECIAL_TOKENS))  # ids BPE_VOCAB_SIZE.., as in Qwen
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        unk_token=None,
        bos_token=None,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=512,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out_dir)
    return fast


def load_tiny_tokenizer(path: Path = ASSET_DIR):
    """The committed tiny tokenizer."""
    from transformers import AutoTokenizer

    file = Path(path) / "tokenizer.json"
    if not file.exists():
        raise FileNotFoundError(f"no tiny tokenizer at {file}; it is committed with the lab: restore it with "
                                f"`git checkout -- {path}`")
    try:
        return AutoTokenizer.from_pretrained(str(path))
    except Exception as err:  # the tokenizers library raises plain Exceptions for a damaged file
        raise ValueError(f"{file} cannot be read as a tokenizer ({err}); restore it with "
                         f"`git checkout -- {path}`") from None
