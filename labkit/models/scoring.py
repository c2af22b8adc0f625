"""Prompt/response rows, masks, and teacher-forced token log-probs.

Everything that learns (SFT, GRPO) or checks a sampler scores responses the
same way: each row is `prompt + response`, RIGHT-padded, and one forward pass
over the full rows gives, for response token j of row b, the log-probability
the model assigned to it from the prefix before it:

    logp[b, j] = log_softmax(logits[b, p_b + j - 1])[response_b[j]]     p_b = prompt length

Only response tokens are scored (EOS included); prompt and padding are masked
*by position*, never by token value (a response may legitimately contain the
pad id).  Positions are passed explicitly (0..T-1 in every row), so right
padding can never shift a row's positions.

Limits of the protocol: prompt <= 256 tokens, response <= 64, total <= 320.
An over-long row is an error, never silently truncated.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..task.problems import FORMAT_INSTRUCTION
from ..config import QWEN

# The protocol's limits (labkit.config; both presets share them).
MAX_PROMPT_TOKENS = QWEN.max_prompt_tokens
MAX_NEW_TOKENS = QWEN.max_new_tokens
MAX_TOTAL_TOKENS = QWEN.max_total_tokens
LIMITS = (MAX_PROMPT_TOKENS, MAX_NEW_TOKENS, MAX_TOTAL_TOKENS)


# --- 1. Prompts and target responses ---------------------------------------------------------


def build_prompt_ids(tokenizer, statement: str, max_prompt_tokens: int = MAX_PROMPT_TOKENS) -> list[int]:
    """The chat-formatted prompt ids of one statement (user turn + assistant header).

    The model sees only the statement and the one formatting instruction.
    Raises ValueError when the prompt exceeds `max_prompt_tokens` (never truncated).
    """
    messages = [{"role": "user", "content": statement + "\n" + FORMAT_INSTRUCTION}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    ids = [int(i) for i in ids]
    if len(ids) > max_prompt_tokens:
        raise ValueError(
            f"prompt has {len(ids)} tokens, more than the limit of {max_prompt_tokens}; "
            "over-long prompts are refused, never truncated"
        )
    return ids


def answer_text(target: int) -> str:
    """The one correct response text for a target: the JSON object the verifier accepts."""
    if isinstance(target, bool) or not isinstance(target, int):
        raise ValueError(f"target must be an integer, got {target!r}")
    return '{"final_stock": %d}' % target


def target_response_ids(tokenizer, target: int) -> list[int]:
    """Ids of the supervised response: the answer text followed by EOS (EOS is supervised too)."""
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no EOS token; the response must end with one")
    return list(tokenizer.encode(answer_text(target), add_special_tokens=False)) + [tokenizer.eos_token_id]


# --- 2. Rows and masks -----------------------------------------------------------------------


@dataclass
class Batch:
    """Right-padded rows `prompt + response` and where each response lies.

    input_ids:        (B, T) long, T = longest row; padding after each row
    attention_mask:   (B, T) long, 1 on real tokens
    position_ids:     (B, T) long, 0..T-1 in every row (right padding never shifts a row)
    prompt_lengths:   (B,) long
    response_lengths: (B,) long
    response_ids:     (B, R) long, R = longest response; pad_id after each response
    response_mask:    (B, R) float32, 1.0 on response tokens (EOS included), 0.0 beyond
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    prompt_lengths: torch.Tensor
    response_lengths: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor

    def to(self, device) -> "Batch":
        """The same batch with every tensor on `device`."""
        return Batch(**{name: getattr(self, name).to(device) for name in self.__dataclass_fields__})

    @property
    def num_active_tokens(self) -> int:
        """Number of response tokens in the batch (the denominator of the SFT loss)."""
        return int(self.response_lengths.sum())


def check_row_lengths(index: int, prompt_len: int, response_len: int, limits=LIMITS) -> None:
    """Raise ValueError naming row `index` and the limit it breaks."""
    max_prompt, max_response, max_total = limits
    if prompt_len == 0:
        raise ValueError(f"row {index}: empty prompt; the first response token needs a prefix to be scored")
    if response_len == 0:
        raise ValueError(f"row {index}: empty response; a response has at least its EOS token")
    if prompt_len > max_prompt:
        raise ValueError(f"row {index}: prompt has {prompt_len} tokens, more than the limit of {max_prompt}")
    if response_len > max_response:
        raise ValueError(f"row {index}: response has {response_len} tokens, more than the limit of {max_response}")
    if prompt_len + response_len > max_total:
        raise ValueError(
            f"row {index}: prompt + response has {prompt_len + response_len} tokens, "
            f"more than the limit of {max_total}"
        )


def make_batch(prompts: list[list[int]], responses: list[list[int]], pad_id: int, limits=LIMITS) -> Batch:
    """Rows `prompt + response`, right-padded with `pad_id`, as a Batch.

    Over-long rows (prompt > 256, response > 64, total > 320 by default) and
    empty responses raise ValueError naming the row; nothing is truncated.
    """
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses; they pair up row by row")
    if not prompts:
        raise ValueError("a batch needs at least one row")
    for i, (p, r) in enumerate(zip(prompts, responses)):
        check_row_lengths(i, len(p), len(r), limits)
    rows = [list(p) + list(r) for p, r in zip(prompts, responses)]
    B, T = len(rows), max(len(row) for row in rows)
    R = max(len(r) for r in responses)
    input_ids = torch.full((B, T), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((B, T), dtype=torch.long)
    response_ids = torch.full((B, R), pad_id, dtype=torch.long)
    response_mask = torch.zeros((B, R), dtype=torch.float32)
    for b, (row, r) in enumerate(zip(rows, responses)):
        input_ids[b, : len(row)] = torch.tensor(row, dtype=torch.long)
        attention_mask[b, : len(row)] = 1
        response_ids[b, : len(r)] = torch.tensor(list(r), dtype=torch.long)
        response_mask[b, : len(r)] = 1.0
    return Batch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=torch.arange(T, dtype=torch.long).expand(B, T).clone(),
        prompt_lengths=torch.tensor([len(p) for p in prompts], dtype=torch.long),
        response_lengths=torch.tensor([len(r) for r in responses], dtype=torch.long),
        response_ids=response_ids,
        response_mask=response_mask,
    )


# --- 3. Teacher-forced scores ----------------------------------------------------------------


def predicting_positions(batch: Batch) -> torch.Tensor:
    """(B, R) long: the position whose logits predict response token j of row b, p_b + j - 1.

    Positions beyond a row's response are clamped into the row (their values are masked).
    """
    R = batch.response_mask.shape[1]
    j = torch.arange(R, device=batch.prompt_lengths.device)
    positions = batch.prompt_lengths[:, None] + j[None, :] - 1  # (B, R)
    return positions.clamp(max=batch.input_ids.shape[1] - 1)


def response_logits(model, batch: Batch) -> torch.Tensor:
    """(B, R, V) logits predicting each response token; zero beyond each response.

    One forward over the full rows.  The output head is applied only at the R
    predicting positions of each row, not at all T: for Qwen (V = 151,936) that
    is the difference between a few hundred MB and several GB of logits.
    """
    device = next(model.parameters()).device
    batch = batch.to(device)
    hidden = model.model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
    ).last_hidden_state  # (B, T, H)
    positions = predicting_positions(batch)  # (B, R)
    picked = torch.gather(hidden, 1, positions[:, :, None].expand(-1, -1, hidden.shape[-1]))  # (B, R, H)
    logits = model.lm_head(picked).float()  # (B, R, V)
    return logits * batch.response_mask[:, :, None]


def response_logprobs(model, batch: Batch, return_logits: bool = False):
    """Teacher-forced log-probs of the response tokens: (logp (B, R), logits (B, R, V) or None).

    logp[b, j] = log_softmax(logits at position p_b + j - 1)[response token j], and
    0 where batch.response_mask is 0.  Gradients flow when autograd is on.  The
    model's train/eval mode is left as it is: callers choose it (the protocol
    scores in eval mode, where dropout is off).
    """
    logits = response_logits(model, batch)  # (B, R, V)
    mask = batch.response_mask.to(logits.device)
    targets = batch.response_ids.to(logits.device)
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = torch.gather(logp_all, 2, targets[:, :, None]).squeeze(2) * mask  # (B, R)
    return logp, (logits if return_logits else None)


def sft_loss(model, batch: Batch, num_active_tokens: int | None = None) -> torch.Tensor:
    """Cross-entropy over all active response tokens: sum(-logp) / number of active tokens.

    The protocol normalises over every active token of the (accumulated) batch,
    NOT as a mean of per-response means: a 6-token response then weighs 6 times
    a 1-token one, as each supervised token counts once.  When a batch of 8 is
    accumulated from micro-batches, pass the accumulated batch's token count as
    `num_active_tokens` so the summed micro-batch losses equal the loss of the
    whole batch.
    """
    logp, _ = response_logprobs(model, batch)
    denominator = batch.num_active_tokens if num_active_tokens is None else num_active_tokens
    if denominator <= 0:
        raise ValueError(f"num_active_tokens must be positive, got {denominator}")
    return -(logp * batch.response_mask.to(logp.device)).sum() / denominator
