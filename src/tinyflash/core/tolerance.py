"""How the project decides that two attention results agree.

"Exact" FlashAttention means exact up to floating-point rounding, so results are compared with a
tolerance against a float64 reference (:func:`tinyflash.reference_attention`):

* float32 results (and lse in every dtype, which is computed and returned in float32) must be
  within ``F32_TOL`` of it, relative;
* float16 results must pass FlashAttention's rule (:func:`fa_rule`) against a naive computation
  in float16;

:func:`within_tolerance` applies that choice; the tests, the lessons and the benchmarks
(``tinyflash.bench.checking``) all use these numbers. The pieces:

* :func:`rel_error` — max|x - ref| / max|ref|, the relative error in the max norm. Non-finite
  reference entries (lse = -inf for rows with no allowed key, NaN from NaN inputs) must be
  matched exactly; anything else there counts as an infinite error.
* :func:`lse_error` — the same for lse, but relative to max(1, max|ref|): lse is a logarithm, and
  an absolute error e in lse is a relative error of about e in the softmax denominator.
* :func:`fa_rule` — FlashAttention's own test rule for reduced precision: the fast path's max
  error against the reference may be at most ``factor`` (2 for outputs, 3 for gradients) times
  the max error of a naive computation in the same precision, plus twice the rounding error of
  doing any arithmetic on the reference in that precision (``fwd_atol`` in flash-attn's tests).
  In the tests "naive in the same precision" means the same input and output dtype: for float16
  inputs tinyflash's naive stage, like every stage, computes in float32 and rounds once at the
  end, so its error is mostly that rounding and the rule is strict. The benchmark also judges
  other libraries' kernels; there the naive computation stores S and P in float16 as well
  (``tinyflash.bench.checking.naive_attention``), as FlashAttention's own tests do.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

F32_TOL = 1e-5  # float32 arithmetic against the float64 reference: max relative error


def to_host64(x) -> np.ndarray:
    """A NumPy float64 copy of ``x``: a NumPy array, a CuPy array, a numba device array or a PyTorch
    tensor (bfloat16 too: widened to float64 by PyTorch, exactly)."""
    if hasattr(x, "detach"):  # PyTorch tensors, on any device
        x = x.detach().to("cpu").double().numpy()
    elif hasattr(x, "get"):  # CuPy arrays
        x = x.get()
    elif hasattr(x, "copy_to_host"):  # numba device arrays
        x = x.copy_to_host()
    return np.asarray(x, dtype=np.float64)


def round_to(x: np.ndarray, dtype) -> np.ndarray:
    """``x`` rounded to ``dtype`` (a NumPy dtype, or 'bfloat16': the top 16 bits of a float32, rounded to
    nearest even), as float64: what storing ``x`` in that type keeps."""
    if str(dtype) != "bfloat16":
        return np.asarray(x).astype(dtype).astype(np.float64)
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    kept = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16).astype(np.uint32)  # ties to even
    return kept.view(np.float32).astype(np.float64)


def _errors(x, ref, floor: float) -> tuple[float, tuple]:
    """(relative error, index of the worst entry)."""
    a, r = to_host64(x), to_host64(ref)
    if a.shape != r.shape:
        raise ValueError(f"shapes differ: got {a.shape}, reference {r.shape}")
    finite = np.isfinite(r)
    if not np.array_equal(a[~finite], r[~finite], equal_nan=True):
        bad = np.argwhere(~finite & ~((a == r) | (np.isnan(a) & np.isnan(r))))[0]
        return np.inf, tuple(int(i) for i in bad)
    if not np.isfinite(a[finite]).all():
        bad = np.argwhere(finite & ~np.isfinite(a))[0]
        return np.inf, tuple(int(i) for i in bad)
    if not finite.any():
        return 0.0, ()
    diff = np.where(finite, np.abs(a - np.where(finite, r, 0.0)), 0.0)
    worst = np.unravel_index(int(np.argmax(diff)), diff.shape)
    denom = max(float(np.abs(r[finite]).max()), floor)
    if denom == 0.0:
        return (0.0 if diff.max() == 0 else np.inf), tuple(int(i) for i in worst)
    return float(diff.max()) / denom, tuple(int(i) for i in worst)


def rel_error(x, ref) -> float:
    """max|x - ref| / max|ref| over finite reference entries (non-finite ones must match exactly)."""
    return _errors(x, ref, 0.0)[0]


def lse_error(lse, ref) -> float:
    """max|lse - ref| / max(1, max|ref|); -inf entries of the reference must match exactly."""
    return _errors(lse, ref, 1.0)[0]


def assert_close(x, ref, tol: float, what: str = "output", *, is_lse: bool = False) -> float:
    """Assert that the relative error of ``x`` against ``ref`` is at most ``tol``; return the error.

    On failure the message gives the error, where the worst entry is, both values and the tolerance.
    """
    err, where = _errors(x, ref, 1.0 if is_lse else 0.0)
    if not err <= tol:
        a, r = to_host64(x), to_host64(ref)
        got = a[where] if where else None
        want = r[where] if where else None
        raise AssertionError(f"{what}: relative error {err:.3e} > tolerance {tol:.1e}; worst entry at index "
                             f"{where}: got {got!r}, reference {want!r}")
    return err


@dataclass(frozen=True)
class RuleCheck:
    """The numbers behind one application of FlashAttention's tolerance rule."""

    fast_error: float  # max|fast - ref|
    naive_error: float  # max|naive - ref|, naive in the same low precision
    atol: float  # rounding of any arithmetic on the reference in that precision
    factor: float

    @property
    def bound(self) -> float:
        return self.factor * self.naive_error + self.atol

    @property
    def ok(self) -> bool:
        return bool(self.fast_error <= self.bound)

    def __str__(self) -> str:
        return (f"fast error {self.fast_error:.3e} vs bound {self.bound:.3e} = {self.factor:g} × naive error "
                f"{self.naive_error:.3e} + rounding {self.atol:.3e} -> {'ok' if self.ok else 'FAIL'}")


def rounding_atol(ref, dtype) -> float:
    """flash-attn's ``fwd_atol``: 2·max|(r + 0.3) - 0.3 - r| with r = ref rounded to ``dtype`` (float16,
    bfloat16, ...) and every operation rounded to ``dtype``."""
    r = to_host64(ref)
    r = round_to(r[np.isfinite(r)], dtype)
    if r.size == 0:
        return 0.0
    c = round_to(0.3, dtype)
    return 2.0 * float(np.abs(round_to(round_to(r + c, dtype) - c, dtype) - r).max())


def fa_rule(fast, naive, ref, dtype, factor: float = 2.0) -> RuleCheck:
    """FlashAttention's rule: max|fast - ref| <= factor · max|naive - ref| + rounding_atol(ref)."""
    f, n, r = to_host64(fast), to_host64(naive), to_host64(ref)
    finite = np.isfinite(r)

    def max_error(a: np.ndarray) -> float:  # non-finite entries must match the reference exactly
        if not np.array_equal(a[~finite], r[~finite], equal_nan=True) or not np.isfinite(a[finite]).all():
            return np.inf
        return float(np.abs(a - r)[finite].max(initial=0.0))

    fast_err, naive_err = max_error(f), max_error(n)
    if not np.isfinite(naive_err):
        raise ValueError("the naive result's non-finite entries differ from the reference's: no baseline")
    return RuleCheck(fast_err, naive_err, rounding_atol(r, dtype), factor)


def assert_fa_rule(fast, naive, ref, dtype, factor: float = 2.0, what: str = "output") -> RuleCheck:
    check = fa_rule(fast, naive, ref, dtype, factor)
    if not check.ok:
        raise AssertionError(f"{what}: {check}")
    return check


@dataclass(frozen=True)
class Verdict:
    """Whether a result agrees with the reference, by the rule for its dtype."""

    ok: bool
    error: float  # relative error against the reference (max norm)
    tolerance: float  # the relative error the rule allowed


LOW_PRECISION = ("float16", "bfloat16")  # judged by FlashAttention's rule; any other dtype by F32_TOL


def within_tolerance(x, ref, dtype, naive=None, factor: float = 2.0, tol: float = F32_TOL) -> Verdict:
    """The project's rule for a result ``x`` of inputs in ``dtype`` (a NumPy dtype or a name) against the
    float64 ``ref``: float16 and bfloat16, FlashAttention's rule against ``naive`` (the same computation done
    naively in that type; ``factor`` 2 for outputs, 3 for gradients); any other dtype, a relative error of
    at most ``tol``."""
    error = rel_error(x, ref)
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    if name not in LOW_PRECISION:
        return Verdict(error <= tol, error, tol)
    if naive is None:
        raise ValueError(f"{name} results are judged against a naive {name} result; got naive=None")
    rule = fa_rule(x, naive, ref, np.float16 if name == "float16" else name, factor)
    r = to_host64(ref)
    scale = float(np.abs(r[np.isfinite(r)]).max(initial=0.0)) or 1.0  # the bound, relative like the error
    return Verdict(rule.ok, error, rule.bound / scale)


FP8_ACCUMULATION_UNIT = 2.0 ** -12  # a Hopper FP8 wgmma's error over its bound (tests/test_wgmma_fp8_ptx.py)


def fp8_bounds(o_ref, lse_ref, v_max: float, n_k: int, d: int, qk_max: float = 0.0, *, gpu: bool,
               against: str) -> tuple[np.ndarray, np.ndarray]:
    """(O bound, lse bound), element by element, for the FP8 kernel's bfloat16 O and float32 lse against
    ``against`` = "emulation" (``tinyflash.fp8_attention``, Bc = 128) or "float64" (attention of the values the
    e4m3 inputs stand for): ``o_ref``, ``lse_ref`` that reference; ``v_max`` = max |v · descale_v|; ``qk_max`` =
    max over (row, key) of Σ_d |q||k| · scale · descale_q · descale_k (the bound of a score's FP8 sum). ``gpu``: the
    FP8 tensor cores' additions (FP8_ACCUMULATION_UNIT) and exp2's ulps on the GPU count too. Derived term by term
    in tests/test_hopper_fp8.py's docstring."""
    o_ref, lse_ref = np.asarray(o_ref, np.float64), np.asarray(lse_ref, np.float64)
    unit = FP8_ACCUMULATION_UNIT if gpu else 0.0
    ds = (d // 32) * unit * qk_max  # a score's error (natural units): the FP8 sums over d
    pv = 2 * ds * v_max + -(-n_k // 32) * unit * v_max  # P moved by e^±dS; the chained P·V sums
    o_bound = 2.0 ** -8 * np.abs(o_ref) + 2.0 ** -15 * v_max + pv  # bfloat16 out; float32's order
    lse_bound = 2.0 ** -15 * (1 + np.abs(np.where(np.isfinite(lse_ref), lse_ref, 0.0))) + ds
    if against == "float64" or gpu:  # P rounded to e4m3 (or, on a GPU, to the other neighbour of a midpoint)
        o_bound = o_bound + (2.0 ** -4 + 2.0 ** -18 * n_k) * v_max
    elif against != "emulation":
        raise ValueError(f"against must be 'emulation' or 'float64'; got {against!r}")
    return o_bound, lse_bound
