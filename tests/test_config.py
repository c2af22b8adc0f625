"""The presets' config: every field documented, defaults read from it, unknown keys refused."""

import ast
import inspect
from dataclasses import fields

import pytest

from labkit.eval import agreement, evaluate
from labkit import config
from labkit.models import presets, sampling, scoring
from labkit.train import sft
from labkit.config import QWEN, TINY


def field_docstrings(cls) -> dict[str, str]:
    """{field: the string literal right after it} (cleanrl's `Args` style)."""
    body = ast.parse(inspect.getsource(cls)).body[0].body
    out = {}
    for node, after in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
            out[node.target.id] = after.value.value
    return out


@pytest.mark.parametrize("cls", [config.PresetConfig, config.Architecture])
def test_every_field_has_a_one_line_docstring(cls):
    docs = field_docstrings(cls)
    assert sorted(docs) == sorted(f.name for f in fields(cls))
    assert all(doc.strip() and "\n" not in doc.strip() for doc in docs.values())


def test_modules_read_their_limits_and_batch_sizes_from_the_config():
    assert (scoring.MAX_PROMPT_TOKENS, scoring.MAX_NEW_TOKENS, scoring.MAX_TOTAL_TOKENS) == (
        QWEN.max_prompt_tokens, QWEN.max_new_tokens, QWEN.max_total_tokens)
    assert sampling.LOGPROB_TOLERANCE == QWEN.logprob_check_tol
    assert evaluate.DEFAULT_BATCH_SIZE == agreement.DEFAULT_BATCH_SIZE == QWEN.eval_batch_size
    assert sft.VALIDATION_BATCH == QWEN.validation_batch_size
    assert presets.QWEN_REVISION == QWEN.qwen_revision
    cfg = presets.tiny_model_config()
    for f in fields(config.Architecture):
        if f.name == "rope_theta":  # transformers 5 keeps it in rope_parameters
            assert cfg.rope_parameters["rope_theta"] == TINY.architecture.rope_theta
        else:
            assert getattr(cfg, f.name) == getattr(TINY.architecture, f.name), f.name


def test_the_presets_differ_only_where_stated():
    differ = sorted(f.name for f in fields(config.PresetConfig) if getattr(QWEN, f.name) != getattr(TINY, f.name))
    assert differ == ["architecture", "grpo_lr", "name", "qwen_revision", "sft_lr"]


def test_unknown_keys_are_refused_with_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown config key\(s\) \['group_sise'\]"):
        TINY.with_overrides(group_sise=8)
