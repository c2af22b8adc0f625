"""A third sampler, ahead of transformers' `generate()`: a static KV cache and a hand-written decode step.

The reference sampler runs the model's own `forward` over the whole sequence at every step; the
fast sampler runs it over one new token with transformers' cache.  On the tiny preset both spend
most of each step in Python: `Qwen2ForCausalLM.forward` builds masks, position embeddings and
cache objects, and walks about a dozen modules per layer, for a model whose arithmetic is ~1M
multiply-adds per token.  This sampler computes the same function from the same weights with
the fewest tensor operations it can:

    * the KV cache is preallocated once, (B, kv heads, prompt + max_new_tokens, head dim) per
      layer, and each step writes one column into it (no concatenation, no cache object);
    * q, k and v come from one matrix product (their weights concatenated once), and so do the
      MLP's gate and up projections;
    * grouped-query attention reshapes the queries to (B, kv heads, group x T, head dim) instead
      of repeating the keys and values;
    * the rotary tables for every position are computed once, in float32, exactly as
      `Qwen2RotaryEmbedding` computes them;
    * each distinct prompt is prefilled once and its cache copied to the rows that share it (the
      G rollouts of a GRPO group), as shared-prompt scoring does for the updates;
    * each row's Gumbel noise is drawn from its own seeded CPU generator (so the draws equal the
      reference sampler's), in blocks of several steps per call, and moved to the model's device
      once per block instead of once per row and step;
    * bookkeeping stays on the device: one (B,) "still running" mask, one sync per step;
    * finished rows leave the decoder (its caches indexed down to the rows still running) once at
      most `COMPACT_BELOW` of its rows run: worked answers average 65 tokens with some at 160, so
      without it most steps computed rows already finished (1.5x faster on them, the same tokens).

It draws tokens exactly as `rollouts.choose_tokens` does, from the same streams, so with the
same seeds the tokens equal the reference sampler's up to floating-point ties (the attention
sums run in a different order: logits differ by ~1e-6; `labkit.eval.agreement.explain_mismatch` says why
where a tie flips).  `tests/test_static_sampler.py` checks it, greedy and seeded, on the tiny
preset and on a 2-layer model of Qwen2.5-0.5B's shape, under both kernel families.

The sampler is standalone: `sample_static` has `sample_fast`'s signature and returns the same
`Rollout`s (sampler "static").  `python -m labkit bench grpo` times it against the reference
sampler, the fast one and `generate()`.
"""

from __future__ import annotations


import torch

from .rollouts import Rollout, choose_tokens, sample_in_batches
from .scoring import MAX_NEW_TOKENS

NOISE_BLOCK_STEPS = 8  # steps of noise drawn per call (responses are often short: do not draw all 64)
NOISE_BLOCK_BYTES = 32 * 2**20  # and at most this much float64 noise per block (B x steps x V x 8 bytes)
COMPACT_BELOW = 0.5  # the finished rows leave the decoder once at most this share of its rows still runs


class StaticDecoder:
    """Qwen2ForCausalLM's forward for sampling, with a preallocated KV cache.

    Built from a model in eval mode (it reads the weights when built: build it again after an
    update).  `prefill` takes left-padded prompts, `step` one new token per row; both return the
    last position's logits (B, V) float32.
    """

    def __init__(self, model, batch_size: int, max_length: int):
        config = model.config
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.groups = self.heads // self.kv_heads
        self.scaling = self.head_dim ** -0.5
        base = model.model
        self.embedding = base.embed_tokens.weight  # (V, H)
        self.head = model.lm_head.weight  # (V, H); tied to the embedding in both presets
        self.final_norm = (base.norm.weight, base.norm.variance_epsilon)
        self.layers = []
        for layer in base.layers:
            attn, mlp = layer.self_attn, layer.mlp
            self.layers.append(dict(
                norm1=(layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon),
                norm2=(layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon),
                qkv_w=torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).detach(),
                qkv_b=torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]).detach(),
                o_w=attn.o_proj.weight,
                gate_up_w=torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).detach(),
                down_w=mlp.down_proj.weight,
            ))
        self.intermediate = config.intermediate_size
        # Rotary tables for every position, as Qwen2RotaryEmbedding computes them (float32, scaled).
        rotary = base.rotary_emb
        positions = torch.arange(max_length, device=self.device, dtype=torch.float32)
        freqs = positions[:, None] * rotary.inv_freq.to(device=self.device, dtype=torch.float32)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)  # (L, head_dim)
        self.cos = (emb.cos() * rotary.attention_scaling).to(self.dtype)  # (L, head_dim)
        self.sin = (emb.sin() * rotary.attention_scaling).to(self.dtype)
        shape = (batch_size, self.kv_heads, max_length, self.head_dim)
        self.keys = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.layers]
        self.values = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.layers]
        self.key_bias = torch.zeros((batch_size, max_length), dtype=self.dtype, device=self.device)
        self.length = 0  # cache columns written so far
        self.batch_size, self.max_length = batch_size, max_length
        self.min_value = torch.finfo(self.dtype).min

    @staticmethod
    def _rms_norm(x: torch.Tensor, norm) -> torch.Tensor:
        weight, eps = norm  # Qwen2RMSNorm's formula in one fused call (float32 models: no casts)
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = self.head_dim // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """ids, positions (B, T) long, valid (B, T) bool (False: a pad) -> logits (B, V) of the last column."""
        B, T = ids.shape
        start, end = self.length, self.length + T
        if end > self.max_length:
            raise ValueError(f"the cache holds {self.max_length} positions; {end} were asked for")
        # additive key bias (B, L): 0 for a real token, the dtype's minimum for a pad (as transformers)
        self.key_bias[:, start:end] = torch.where(valid, 0.0, self.min_value)
        mask = self.key_bias[:, None, None, None, :end]  # (B, 1, 1, 1, end)
        if T > 1:  # the prompt: a query does not see the keys after it
            future = torch.ones((T, end), dtype=torch.bool, device=self.device).triu(diagonal=start + 1)
            mask = mask.masked_fill(future, self.min_value)  # (B, 1, 1, T, end)
        cos, sin = self.cos[positions][:, :, None], self.sin[positions][:, :, None]  # (B, T, 1, head_dim)
        heads, kv_heads, d = self.heads, self.kv_heads, self.head_dim
        x = torch.nn.functional.embedding(ids, self.embedding)  # (B, T, H)
        for layer, keys, values in zip(self.layers, self.keys, self.values):
            h = self._rms_norm(x, layer["norm1"])
            qkv = torch.nn.functional.linear(h, layer["qkv_w"], layer["qkv_b"])  # (B, T, (heads + 2 kv) d)
            qkv = qkv.view(B, T, heads + 2 * kv_heads, d)
            qk = self._rotate(qkv[:, :, :heads + kv_heads], cos, sin)  # queries and keys rotated together
            q = qk[:, :, :heads].transpose(1, 2)  # (B, heads, T, d)
            keys[:, :, start:end] = qk[:, :, heads:].transpose(1, 2)
            values[:, :, start:end] = qkv[:, :, heads + kv_heads:].transpose(1, 2)
            # (B, kv, groups*T, d) @ (B, kv, d, end): each kv head serves its group of query heads
            q = q.reshape(B, kv_heads, self.groups * T, d)
            scores = torch.matmul(q, keys[:, :, :end].transpose(2, 3)) * self.scaling
            scores = scores.view(B, kv_heads, self.groups, T, end) + mask
            weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(self.dtype)
            out = torch.matmul(weights.view(B, kv_heads, self.groups * T, end), values[:, :, :end])
            out = out.view(B, heads, T, d).transpose(1, 2).reshape(B, T, heads * d)
            x = x + torch.nn.functional.linear(out, layer["o_w"])
            h = self._rms_norm(x, layer["norm2"])
            gate, up = torch.nn.functional.linear(h, layer["gate_up_w"]).split(self.intermediate, dim=-1)
            x = x + torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, layer["down_w"])
        self.length = end
        last = self._rms_norm(x[:, -1], self.final_norm)  # (B, H)
        return torch.nn.functional.linear(last, self.head).float()  # (B, V)

    def prefill(self, ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Left-padded prompts ids (B, P), valid (B, P) bool -> logits (B, V); positions count real tokens."""
        positions = (valid.long().cumsum(dim=1) - 1).clamp(min=0)
        self.next_position = valid.long().sum(dim=1, keepdim=True)  # (B, 1)
        return self._forward(ids, positions, valid)

    def expand(self, rows: torch.Tensor) -> torch.Tensor:
        """Give row b the cache of prefilled row rows[b] (B,) long: G rollouts share one prompt's prefill."""
        self.keys = [k[rows] for k in self.keys]
        self.values = [v[rows] for v in self.values]
        self.key_bias, self.next_position = self.key_bias[rows], self.next_position[rows]
        self.batch_size = len(rows)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (B,) long, one per row -> logits (B, V) for the position after them."""
        logits = self._forward(tokens[:, None], self.next_position,
                               torch.ones((self.batch_size, 1), dtype=torch.bool, device=self.device))
        self.next_position = self.next_position + 1
        return logits


class NoiseBlocks:
    """Each row's Gumbel noise from its own seeded CPU generator, drawn several steps at a time.

    `GumbelStream` draws one (V,) float64 uniform vector per step; torch's CPU generator fills a
    tensor element by element, so one draw of (steps x V) holds the same numbers as `steps`
    draws of (V,).  Returned on `device`, (B, V) per step, ready to add to the log-probs.
    """

    def __init__(self, seeds: list[int], vocab_size: int, max_steps: int, device):
        self.generators = [torch.Generator(device="cpu").manual_seed(int(s)) for s in seeds]
        self.vocab_size, self.device, self.max_steps = vocab_size, device, max_steps
        per_step = len(seeds) * vocab_size * 8
        self.block = max(1, min(max_steps, NOISE_BLOCK_STEPS, NOISE_BLOCK_BYTES // per_step))
        self.noise, self.first = None, 0

    def at(self, step: int) -> torch.Tensor:
        if self.noise is None or step >= self.first + self.noise.shape[1]:
            steps = min(self.block, self.max_steps - step)
            u = torch.stack([torch.rand(steps, self.vocab_size, generator=g, dtype=torch.float64)
                             for g in self.generators])  # (B, steps, V)
            u = u.clamp(min=torch.finfo(torch.float64).tiny)  # as GumbelStream: every value finite
            self.noise, self.first = (-torch.log(-torch.log(u))).to(self.device), step
        return self.noise[:, step - self.first]


@torch.no_grad()
def _sample_static_batch(model, prompts, seeds, max_new_tokens, eos, pad_id):
    """(responses, logprobs) for one batch of rows."""
    device = next(model.parameters()).device
    B, P = len(prompts), max(len(p) for p in prompts)
    # Each distinct prompt is prefilled once (a GRPO group's G rollouts share theirs), then copied.
    distinct = list(dict.fromkeys(tuple(p) for p in prompts))
    index = {p: u for u, p in enumerate(distinct)}
    rows = torch.tensor([index[tuple(p)] for p in prompts], dtype=torch.long, device=device)
    ids = torch.full((len(distinct), P), pad_id, dtype=torch.long)
    valid = torch.zeros((len(distinct), P), dtype=torch.bool)
    for u, p in enumerate(distinct):
        ids[u, P - len(p):] = torch.tensor(p, dtype=torch.long)
        valid[u, P - len(p):] = True
    decoder = StaticDecoder(model, len(distinct), P + max_new_tokens)
    logits = decoder.prefill(ids.to(device), valid.to(device))[rows]  # (B, V)
    decoder.expand(rows)
    noise = None if seeds[0] is None else NoiseBlocks(seeds, logits.shape[-1], max_new_tokens, device)
    tokens = torch.zeros((B, max_new_tokens), dtype=torch.long, device=device)
    logps = torch.zeros((B, max_new_tokens), dtype=torch.float32, device=device)
    running = torch.ones(B, dtype=torch.bool, device=device)
    lengths = torch.zeros(B, dtype=torch.long, device=device)  # tokens each row generated (EOS included)
    live = torch.arange(B, device=device)  # the decoder's rows: the batch's rows still in it
    for step in range(max_new_tokens):
        step_noise = None if noise is None else noise.at(step)[live]
        chosen, logp = choose_tokens(logits, step_noise)  # (rows in the decoder,) each
        tokens[live, step], logps[live, step] = chosen, logp
        lengths[live] += running[live]
        running[live] = running[live] & (chosen != eos)
        if step == max_new_tokens - 1 or not bool(running.any()):
            break
        going = running[live]
        if int(going.sum()) <= COMPACT_BELOW * len(live):  # drop the finished rows from the decoder
            decoder.expand(going.nonzero().squeeze(1))
            live, chosen = live[going], chosen[going]
        # finished rows still in the decoder are fed a pad so the batch stays rectangular; their outputs are unused
        logits = decoder.step(torch.where(running[live], chosen, torch.full_like(chosen, pad_id)))
    tokens, logps, lengths = tokens.tolist(), logps.tolist(), lengths.tolist()
    return [t[:n] for t, n in zip(tokens, lengths)], [lp[:n] for lp, n in zip(logps, lengths)]


def sample_static(
    model,
    tokenizer,
    prompts: list[list[int]],
    seeds: list[int] | None = None,
    *,
    greedy: bool = False,
    max_new_tokens: int = MAX_NEW_TOKENS,
    problem_ids: list[str] | None = None,
    rollout_ids: list[str] | None = None,
    eos_token_id: int | None = None,
    policy_digest: str | None = None,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    batch_size: int | None = None,
) -> list[Rollout]:
    """Same rollouts as `sampling.sample_reference`, batched, with a static KV cache (sampler "static").

    Arguments as `sampling.sample_fast`'s; each rollout's `seconds` is its batch's wall time
    divided by the batch size.
    """
    return sample_in_batches(_sample_static_batch, "static", model, tokenizer, prompts, seeds,
                                      greedy=greedy, max_new_tokens=max_new_tokens, problem_ids=problem_ids,
                                      rollout_ids=rollout_ids, eos_token_id=eos_token_id,
                                      policy_digest=policy_digest, temperature=temperature, top_k=top_k,
                                      top_p=top_p, batch_size=batch_size)
