"""The two model presets: a tiny Qwen2 the lab pretrains itself, and Qwen2.5-0.5B-Instruct.

Both are `transformers.Qwen2ForCausalLM` with eager attention and tied input /
output embeddings, so every line of labkit runs unchanged on either.
"""

from __future__ import annotations

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from .tokenizer import load_tiny_tokenizer

# The tiny architecture (DESIGN.md): about 1M parameters.  The embedding has
# more rows than the tokenizer has tokens (512 > 494), as Qwen's does
# (151,936 > 151,665), so an undecodable generated id is a real case.
TINY_ARCH = dict(
    vocab_size=512,
    hidden_size=128,
    intermediate_size=512,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,  # Qwen2Config defaults to untied; Qwen2.5-0.5B ties them
    # A non-zero attention dropout makes the "dropout left on" bug of chapter 2 real
    # (Qwen2.5's own config has 0.0, where the rule is latent).
    attention_dropout=0.1,
    attn_implementation="eager",
)


def tiny_model_config(tokenizer=None) -> Qwen2Config:
    """The tiny preset's `Qwen2Config`, with the tokenizer's special ids."""
    tokenizer = tokenizer or load_tiny_tokenizer()
    cfg = Qwen2Config(
        **TINY_ARCH,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return cfg


def new_tiny_model(seed: int = 0, tokenizer=None) -> Qwen2ForCausalLM:
    """A randomly initialised tiny model (pretraining starts here), FP32, eval mode."""
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(tiny_model_config(tokenizer))
    model.to(torch.float32)
    return model.eval()
