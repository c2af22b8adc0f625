"""Chapter 5, exact KL: `check_ch05_blocked_kl` grades the exact KL computed one vocabulary block at a time."""

from __future__ import annotations

from ._calling import require_like, ExerciseError, call_student, require_function


def _ch05_local_blocks(logits_cur, logits_ref, block_size):
    """The protocol's warning: each block softmax-normalised on its own (a different, wrong sum)."""
    import torch

    total = torch.zeros(logits_cur.shape[0], dtype=torch.float64)
    for start in range(0, logits_cur.shape[-1], block_size):
        logp = torch.log_softmax(logits_cur[:, start:start + block_size].double(), dim=-1)
        logq = torch.log_softmax(logits_ref[:, start:start + block_size].double(), dim=-1)
        total += (logp.exp() * (logp - logq)).sum(dim=-1)
    return total


def _ch05_dropped_last_block(logits_cur, logits_ref, block_size):
    """The KL with the last, shorter block left out (a range that stops one block early)."""
    import torch

    V = logits_cur.shape[-1]
    kept = (V // block_size) * block_size if V % block_size else V
    if kept == V:
        return None
    logp = torch.log_softmax(logits_cur.double(), dim=-1)[:, :kept]
    logq = torch.log_softmax(logits_ref.double(), dim=-1)[:, :kept]
    return (logp.exp() * (logp - logq)).sum(dim=-1)


CH05_WHOLE_ROW = ("the exercise computes the KL one block of the vocabulary at a time: your function called {op} on "
                  "all V = {V} columns at once (the memory the blocks save is the (N, V) tensor that builds)")


class _WholeRowSpy:
    """Records a softmax, log_softmax or logsumexp taken over all V columns of a tensor (torch function mode)."""

    OPS = ("log_softmax", "softmax", "logsumexp")

    def __init__(self, V: int):
        import torch

        self.V, self.seen = V, None

        class Mode(torch.overrides.TorchFunctionMode):
            def __torch_function__(mode, func, types, args=(), kwargs=None):
                name = getattr(func, "__name__", "")
                if self.seen is None and name in self.OPS and args and isinstance(args[0], torch.Tensor) \
                        and args[0].dim() >= 1 and args[0].shape[-1] == self.V:
                    self.seen = name
                return func(*args, **(kwargs or {}))

        self.mode = Mode()


def check_ch05_blocked_kl(blocked_kl) -> bool:
    """Grade chapter 5's exercise: `blocked_kl(logits_cur, logits_ref, block_size) -> (N,)`.

    The exact KL(p_cur || p_ref) of each row's next-token distributions, computed one
    vocabulary block at a time with the full normaliser.  Compared with
    `labkit.grpo.losses.exact_prefix_kl` in float64 (within 1e-10 relative) on random logits,
    with block sizes that do and do not divide V, large logits (no overflow), and
    identical rows (KL exactly 0 is not required, but within 1e-12).
    """
    import torch

    from ...grpo.losses import exact_prefix_kl

    require_function(blocked_kl)
    g = torch.Generator().manual_seed(5)
    cur = torch.randn(6, 50, generator=g, dtype=torch.float64) * 2.0
    ref = torch.randn(6, 50, generator=g, dtype=torch.float64) * 2.0
    cases = [
        ("random logits, 6 prefixes x V = 50", cur, ref, 16),
        ("the same, one block holding the whole vocabulary", cur, ref, 50),
        ("the same, blocks of 7 (the last block is shorter)", cur, ref, 7),
        ("the same, blocks of 1", cur, ref, 1),
        ("large logits (exp would overflow without subtracting the maximum)", cur * 400.0, ref * 400.0, 16),
        ("identical distributions", cur, cur.clone(), 16),
        ("rows 600 apart (one maximum for the whole tensor underflows the lower rows)",
         cur + 600.0 * torch.arange(6, dtype=torch.float64)[:, None], ref + 600.0 * torch.arange(6, dtype=torch.float64)[:, None], 16),
    ]
    for number, (what, logits_cur, logits_ref, block_size) in enumerate(cases, start=1):
        where = f"case {number} of {len(cases)} ({what}, block_size={block_size})"
        spy = _WholeRowSpy(logits_cur.shape[-1])
        with spy.mode:
            got = call_student(blocked_kl, logits_cur.clone(), logits_ref.clone(), block_size, where=where)
        if spy.seen and 1 < block_size < logits_cur.shape[-1]:  # blocks of 1: a logsumexp over the V block sums is right
            raise ExerciseError(f"{where}: " + CH05_WHOLE_ROW.format(op=spy.seen, V=logits_cur.shape[-1]))
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != (logits_cur.shape[0],):
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            raise ExerciseError(f"{where}: returned {shape}; return one KL per prefix, shape ({logits_cur.shape[0]},)")
        require_like(got, logits_cur, "blocked_kl", finite=False)  # the overflow's own hint follows
        got = got.detach().double()
        expected = exact_prefix_kl(logits_cur, logits_ref, block_size=block_size)
        if not torch.isfinite(got).all():
            hint = ("subtract each row's own maximum, z.max(dim=-1, keepdim=True), not one maximum of the whole "
                    "tensor: the rows far below it underflow to 0, and log 0 is -inf" if "apart" in what else
                    "subtract each row's maximum before exp (log-sum-exp), so no exponential overflows")
            raise ExerciseError(f"{where}: got {got.tolist()}. Hint: {hint}.")
        if torch.allclose(got, expected, rtol=1e-10, atol=1e-12):
            continue
        local = _ch05_local_blocks(logits_cur, logits_ref, block_size)
        if torch.allclose(got, local, rtol=1e-10, atol=1e-12):
            hint = ("you normalised each block on its own; every block needs the FULL normaliser, "
                    "log p(v) = z_v - logsumexp over all V entries, found by a first pass over the blocks")
        elif (dropped := _ch05_dropped_last_block(logits_cur, logits_ref, block_size)) is not None and \
                torch.allclose(got, dropped, rtol=1e-10, atol=1e-12):
            hint = (f"the last block, shorter than block_size (V = {logits_cur.shape[-1]} is not a multiple of "
                    f"{block_size}), is left out: let the blocks run to V, range(0, V, block_size)")
        elif torch.allclose(got, exact_prefix_kl(logits_ref, logits_cur, block_size=block_size), rtol=1e-10, atol=1e-12):
            hint = "that is KL(p_ref || p_cur); the lab's KL weighs by the current policy: sum p_cur (log p_cur - log p_ref)"
        else:
            hint = "sum over all V entries of p_cur(v) (log p_cur(v) - log p_ref(v)), with log p = z - logsumexp(z)"
        raise ExerciseError(f"{where}: got {[round(v, 9) for v in got.tolist()]}, expected "
                            f"{[round(v, 9) for v in expected.tolist()]}. Hint: {hint}.")
    print(f"Correct: your blocked_kl agrees with labkit.grpo.losses.exact_prefix_kl on all {len(cases)} cases.")
    return True
