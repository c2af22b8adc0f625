"""Shared-prompt teacher-forced scoring: each GRPO prompt computed once, not G times.

A GRPO update scores P prompts x G responses.  `scoring.response_logprobs` runs
one forward over every full row `prompt + response`, so each prompt (~64 tokens)
is computed G times, once per response (~9 tokens): most of the work is prompt
tokens.  Causal attention makes that repetition unnecessary: a prompt position
never looks at what follows it, so its keys, values and hidden states are the
same in all G rows of its group.  This module computes them once:

1. one forward of the P prompts (right-padded, positions 0..L-1, `use_cache=True`)
   keeps each layer's keys and values in the model's own `DynamicCache`;
2. the cache is expanded to the B = P x G response rows with `repeat_interleave`
   (`DynamicCache.batch_repeat_interleave`): a differentiable copy, so the
   gradients of all G rows flow back into the single prompt computation;
3. one forward of the response tokens, in which row b attends to its prompt's
   keys/values and causally to its own response tokens.  The 2-D attention mask
   is `[prompt mask | response mask]`, so each prompt's right padding (which lies
   between the prompt and the response in key space) is hidden; the response
   tokens' positions continue from the prompt's true length, p_b + j, exactly
   their positions in the full row.

Response token 0 is predicted by the last real prompt position, whose hidden
state comes from the prompt forward; token j >= 1 by response token j - 1.  The
last response token is never an input (nothing it predicts is scored), so when
every response has one token the second forward is skipped altogether.

The output is laid out exactly as `scoring.response_logprobs(model,
scoring.make_batch(rows' prompts, responses, pad_id), return_logits)`: (B, R)
log-probs and (B, R, V) float32 logits, R = longest response, zeros beyond each
response; the same row checks (`scoring.check_row_lengths`) refuse the same rows.
The two paths agree to float rounding, not bit for bit (the attention sums run
over differently laid-out keys); `tests/test_shared_prompt.py` states the bounds.

Dropout: the lab scores in eval mode, where the two paths compute the same
function.  In train mode dropout would draw different masks in the two paths
(and the shared path would use ONE dropout mask for a prompt's G copies), so
they would agree only in distribution, not number for number.

Only the model's own modules are used (`model.model`, `model.lm_head`), with
eager attention as the lab loads it.  Models with sliding-window layers are
refused (their cache layers crop keys; Qwen2.5-0.5B-Instruct has none).
transformers 5.24 names the cache `cache` (the forward's keyword and the output's
field); `past_key_values` is its deprecated alias until 5.40.  The 4-D eager mask
transformers builds from the 2-D mask and the cache's length is causal with the
query offset L (the padded prompt length), so response token j of row b sees
keys 0..L+j minus every padded key: exactly the full row's keys.
"""

from __future__ import annotations

import time

import torch

from . import scoring


def _check_shapes(prompts, responses, G: int, limits=scoring.LIMITS) -> tuple[int, int]:
    if isinstance(G, bool) or not isinstance(G, int) or G < 1:
        raise ValueError(f"G must be a positive integer, got {G!r}")
    P = len(prompts)
    if P == 0:
        raise ValueError("at least one prompt is needed")
    if len(responses) != P * G:
        raise ValueError(
            f"{len(responses)} responses for {P} prompts x G {G}: "
            f"expected {P * G} (prompt-major: rows k*G..k*G+G-1 share prompts[k])"
        )
    for b, r in enumerate(responses):
        scoring.check_row_lengths(b, len(prompts[b // G]), len(r), limits)
    return P, P * G


def _right_padded(rows: list[list[int]], width: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids (N, width) long padded with pad_id, mask (N, width) long, 1 on real tokens)."""
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(list(row), dtype=torch.long)
        mask[i, : len(row)] = 1
    return ids, mask


# Response tokens (rows x longest response) per bucket of the bucketed forward: on the tiny preset's worked
# answers (16 x 8 rows, 65 tokens on average, up to 160) 512 to 2,048 run alike, 8,192 (two buckets) 1.4x slower.
BUCKET_TOKENS = 1024


def buckets(lengths: list[int], bucket_tokens: int) -> list[list[int]]:
    """Rows grouped for the response forward without padding to the batch's longest response.

    lengths: each row's response length.  Rows are taken longest first (ties by row index) and a bucket
    closes when one more row would make rows x (its longest response - 1) exceed `bucket_tokens` (a
    bucket holds at least one row).  Returns each bucket's row indices; every row in exactly one.
    """
    if bucket_tokens < 1:
        raise ValueError(f"bucket_tokens {bucket_tokens}: must be a positive number of tokens")
    order = sorted(range(len(lengths)), key=lambda b: (-lengths[b], b))
    out: list[list[int]] = []
    for b in order:
        if out and (len(out[-1]) + 1) * max(lengths[out[-1][0]] - 1, 1) <= bucket_tokens:
            out[-1].append(b)
        else:
            out.append([b])
    return out


def shared_response_hidden(model, prompts: list[list[int]], responses: list[list[int]], G: int,
                           pad_id: int, *, limits=scoring.LIMITS,
                           bucket_tokens: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(hidden (B, R, H) in the model's dtype, response_ids (B, R) long, response_mask (B, R) float32).

    hidden[b, j] is the final (normed) hidden state that predicts response token j
    of row b: the last real prompt position for j = 0, response token j - 1 after.
    Values beyond a row's response are unspecified (they are masked by the callers).
    limits: the row limits checked (`scoring.check_row_lengths`; worked answers allow 160 tokens).
    bucket_tokens: None runs every response row padded to the batch's longest response (step 3
    above, once); a number runs step 3 once per bucket of rows of similar length (`buckets`), each
    padded to its own longest, so that a batch of mostly short responses with a few long ones
    (worked answers: 65 tokens on average, up to 160) computes about the tokens it holds.  The same
    function; the sums run over other shapes, so the values agree to float rounding, not bit for bit.
    """
    P, _ = _check_shapes(prompts, responses, G, limits)
    if getattr(model.model, "has_sliding_layers", False):
        raise ValueError("shared-prompt scoring does not support sliding-window attention layers")
    device = next(model.parameters()).device

    prompt_lengths = torch.tensor([len(p) for p in prompts], dtype=torch.long, device=device)
    L = int(prompt_lengths.max())
    prompt_ids, prompt_mask = (t.to(device) for t in _right_padded(prompts, L, pad_id))
    R = max(len(r) for r in responses)
    response_ids, response_mask = (t.to(device) for t in _right_padded(responses, R, pad_id))

    # 1. The prompts, once: hidden states and every layer's keys/values.
    out = model.model(
        input_ids=prompt_ids,
        attention_mask=prompt_mask,
        position_ids=torch.arange(L, device=device).expand(P, L),
        use_cache=True,
    )
    last = out.last_hidden_state[torch.arange(P, device=device), prompt_lengths - 1]  # (P, H)
    first = last.repeat_interleave(G, dim=0)[:, None, :]  # (B, 1, H): predicts response token 0

    if R == 1:  # every response is one token: nothing else to compute
        hidden = first
    elif bucket_tokens is not None:
        hidden = torch.cat([first, _bucketed_rest(model, out.cache, prompt_lengths, prompt_mask, response_ids,
                                                  response_mask, G, bucket_tokens)], dim=1)
    else:
        # 2. The prompt keys/values for the B rows (differentiable copies).
        cache = out.cache
        cache.batch_repeat_interleave(G)
        # 3. The responses' tokens 0..R-2 (the last token predicts nothing scored).
        inputs = response_ids[:, : R - 1]
        positions = prompt_lengths.repeat_interleave(G)[:, None] + torch.arange(R - 1, device=device)[None, :]
        attention_mask = torch.cat([prompt_mask.repeat_interleave(G, dim=0), response_mask[:, : R - 1]], dim=1)
        rest = model.model(
            input_ids=inputs,
            attention_mask=attention_mask,
            position_ids=positions,
            cache=cache,
            use_cache=False,
        ).last_hidden_state  # (B, R-1, H)
        hidden = torch.cat([first, rest], dim=1)  # (B, R, H)
    return hidden, response_ids, response_mask.to(torch.float32)


def _bucketed_rest(model, cache, prompt_lengths: torch.Tensor, prompt_mask: torch.Tensor,
                   response_ids: torch.Tensor, response_mask: torch.Tensor, G: int,
                   bucket_tokens: int) -> torch.Tensor:
    """(B, R-1, H): step 3 bucket by bucket; row b's hidden states at its response tokens 0..R-2 (zeros
    beyond its response).  Each bucket's rows get their prompts' keys and values by index (a
    differentiable gather from the P prompts' cache, as `batch_repeat_interleave` is for all rows)."""
    from transformers import DynamicCache

    B, R = response_ids.shape
    lengths = response_mask.sum(1).long().tolist()
    device, parts, order = response_ids.device, [], []
    for rows in buckets(lengths, bucket_tokens):
        width = max(lengths[rows[0]] - 1, 1)  # the bucket's longest response, less its last token
        index = torch.tensor(rows, dtype=torch.long, device=device)
        source = index // G  # each row's prompt
        rows_cache = DynamicCache([(layer.keys[source], layer.values[source]) for layer in cache.layers])
        hidden = model.model(
            input_ids=response_ids[index, :width],
            attention_mask=torch.cat([prompt_mask[source], response_mask[index, :width].long()], dim=1),
            position_ids=prompt_lengths[source][:, None] + torch.arange(width, device=device)[None, :],
            cache=rows_cache,
            use_cache=False,
        ).last_hidden_state  # (rows, width, H)
        parts.append(torch.nn.functional.pad(hidden, (0, 0, 0, R - 1 - width)))
        order += rows
    inverse = torch.empty(B, dtype=torch.long, device=device)
    inverse[torch.tensor(order, dtype=torch.long, device=device)] = torch.arange(B, device=device)
    return torch.cat(parts, dim=0)[inverse]


def shared_response_logprobs(model, prompts: list[list[int]], responses: list[list[int]], G: int,
                             pad_id: int, return_logits: bool = False, *, limits=scoring.LIMITS,
                             bucket_tokens: int | None = None):
    """Teacher-forced log-probs of P x G responses with each prompt computed once.

    prompts: P token lists; responses: P x G token lists, prompt-major (rows
    k*G..k*G+G-1 answer prompts[k]).  Returns (logp (B, R), logits (B, R, V) float32
    or None), laid out exactly as `scoring.response_logprobs` of the full rows:
    zeros beyond each response.  Gradients flow when autograd is on; the model's
    train/eval mode is left as it is (score in eval mode: see the module docstring
    on dropout).  Raises ValueError when len(responses) != P x G or a row
    breaks the protocol's limits.
    """
    hidden, response_ids, mask = shared_response_hidden(model, prompts, responses, G, pad_id, limits=limits,
                                                        bucket_tokens=bucket_tokens)
    logits = model.lm_head(hidden).float() * mask[:, :, None]  # (B, R, V)
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = torch.gather(logp_all, 2, response_ids[:, :, None]).squeeze(2) * mask  # (B, R)
    return logp, (logits if return_logits else None)


def _example_loss(logp: torch.Tensor, logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A GRPO-shaped scalar: a weighted sum of log-probs plus a KL-like term on the logits."""
    weights = torch.linspace(-1.0, 1.0, logp.shape[0], device=logp.device)[:, None]
    logq = torch.log_softmax(logits, dim=-1)
    kl_like = (logq.exp() * logq).sum(-1)  # negative entropy per position
    return (logp * weights).sum() + 0.1 * (kl_like * mask).sum()


def benchmark(model, prompts: list[list[int]], responses: list[list[int]], G: int, pad_id: int,
              repeats: int = 3) -> dict:
    """Time forward + backward of the plain and the shared path, side by side, in this process.

    Each repeat runs both paths once (alternating which goes first), computing
    `_example_loss` from (logp, logits) and calling backward; the best time of
    each path is kept.  Returns {"plain_s", "shared_s", "ratio" (plain / shared),
    "rows", "prompts", "G", "repeats", "max_abs_logp_diff"}.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    _check_shapes(prompts, responses, G)
    rows = [prompts[b // G] for b in range(len(responses))]
    shared_mask = scoring.make_batch(rows, responses, pad_id).response_mask

    def plain():
        batch = scoring.make_batch(rows, responses, pad_id)
        logp, logits = scoring.response_logprobs(model, batch, return_logits=True)
        _example_loss(logp, logits, batch.response_mask.to(logp.device)).backward()
        return logp.detach()

    def shared():
        logp, logits = shared_response_logprobs(model, prompts, responses, G, pad_id, return_logits=True)
        _example_loss(logp, logits, shared_mask.to(logp.device)).backward()
        return logp.detach()

    def timed(fn):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        value = fn()
        elapsed = time.perf_counter() - start
        model.zero_grad(set_to_none=True)
        return elapsed, value

    best = {"plain": float("inf"), "shared": float("inf")}
    diff = 0.0
    for i in range(repeats):
        order = [("plain", plain), ("shared", shared)]
        if i % 2:
            order.reverse()
        values = {}
        for name, fn in order:
            elapsed, values[name] = timed(fn)
            best[name] = min(best[name], elapsed)
        diff = max(diff, float((values["plain"] - values["shared"]).abs().max()))
    return {
        "plain_s": best["plain"],
        "shared_s": best["shared"],
        "ratio": best["plain"] / best["shared"],
        "rows": len(responses),
        "prompts": len(prompts),
        "G": G,
        "repeats": repeats,
        "max_abs_logp_diff": diff,
    }
