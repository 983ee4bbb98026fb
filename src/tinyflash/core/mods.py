"""Masks and score modifications written as plain Python functions, evaluated on tiles of indices.

FlexAttention's two functions, with its semantics:

    score_mod(score, b, h, q_idx, kv_idx) -> the score to use     (score = scale · q·k, scaled)
    mask_mod(b, h, q_idx, kv_idx)         -> whether the key is kept

b is the batch index, h the QUERY head (with grouped-query heads too), q_idx in [0, Nq) and
kv_idx in [0, Nk) the absolute positions of the query and the key. b and h come from q's
leading dims: q (Nq, d) is b = h = 0; (H, Nq, d) is b = 0, h = the head; (B, H, Nq, d) both.
``causal`` and ``mask_mod`` both apply: a key is kept where both keep it. The scores of masked
keys are -inf, after the score_mod: a score_mod sees every score of a tile it is evaluated on.

The functions are plain Python of scalars (arithmetic, comparisons, ``&``, ``|``, ``math``), so
that a kernel can compile the very same function as a device function. The NumPy stages call
them on a whole tile at once: the indices as broadcasting int64 arrays, q_idx (rows, 1),
kv_idx (1, cols), h and b along the leading dims. ``math.tanh`` takes no array, and ``and``,
``or``, ``if`` on arrays raise: then the function is called element by element instead, with
NumPy scalars of the same dtypes, so that either way the arithmetic, and so every bit of the
result, is the same (:func:`evaluate`).

The backward needs d score_mod / d score: the same function is called with a dual number
(``tinyflash.core.dual``), and the caller passes no derivative.

Every stage takes its masks from here: :func:`keep_mask` (causal AND mask_mod for query rows ×
key columns) and :func:`modified_scores` (score_mod, then the mask, on a tile of scores), so
stage 0's whole matrix and stage 1's tiles come from the same functions; the block mask
(``tinyflash.core.block_mask``) classifies tiles with keep_mask too.

**For packed sequences.** A caller that runs a stage on one sequence of a packed batch at a time
(a view of q, k, v) gives the stage an :class:`IndexBase`: ``batch`` is the b the mods see for
the view's first batch entry (the sequence's index), ``q`` and ``kv`` are added to the q_idx and
kv_idx they see. The stages take it as the private keyword ``_index_base`` (``blocked_attention``,
``naive_attention`` and their backwards); the causal rule stays the view's own (bottom-right in
the view), and so does the block mask a stage builds.
"""

from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass

import numpy as np

from .dual import Dual, dual_aware
from .masks import allowed


@dataclass(frozen=True)
class IndexBase:
    """What the mods see for index 0 of a call: the batch b of its first batch entry, and the
    offsets added to q_idx and kv_idx (a sequence of a packed batch, a chunk of a longer one)."""

    batch: int = 0
    q: int = 0
    kv: int = 0


NO_BASE = IndexBase()


@dataclass(frozen=True)
class Mods:
    """A call's modifications and what evaluating them needs: q's leading dims and the causal rule."""

    score_mod: object  # callable (score, b, h, q_idx, kv_idx) -> score, or None
    mask_mod: object  # callable (b, h, q_idx, kv_idx) -> bool, or None
    lead: tuple  # q's leading dims: (), (H,) or (B, H)
    n_q: int
    n_k: int
    causal: bool
    base: IndexBase = NO_BASE
    dual_score_mod: object = None  # score_mod with math answered by dual numbers (core/dual.py), made once a call

    @property
    def masked(self) -> bool:
        """Whether any key may be masked: causal or a mask_mod."""
        return self.causal or self.mask_mod is not None


def check_mod(fn, name: str, arity: int):
    """``fn`` if it is None or a callable taking ``arity`` positional arguments; else TypeError naming ``name``."""
    if fn is None:
        return None
    if not callable(fn):
        raise TypeError(f"{name} must be a callable or None; got {fn!r} of type {type(fn).__name__}")
    try:
        inspect.signature(fn).bind(*range(arity))
    except TypeError:
        args = "(score, b, h, q_idx, kv_idx)" if arity == 5 else "(b, h, q_idx, kv_idx)"
        raise TypeError(f"{name} must take {arity} positional arguments {args}; got {fn!r} with signature "
                        f"{inspect.signature(fn)}") from None
    except ValueError:  # a builtin without a signature: its call will tell
        pass
    return fn


def check_heads_layout(lead: tuple, what: str) -> tuple:
    """(B, H) from q's leading dims, which must be (), (H,) or (B, H) when mods or sinks are given."""
    if len(lead) > 2:
        raise ValueError(f"{what} needs q of shape (Nq, d), (H, Nq, d) or (B, H, Nq, d), so that b and h are "
                         f"defined; got leading dims {lead}")
    return (1, 1) if not lead else (1, lead[0]) if len(lead) == 1 else tuple(lead)


def make_mods(score_mod, mask_mod, prob, base=None, *, always: bool = False) -> Mods | None:
    """The checked Mods of a call (``prob`` from check_attention_inputs); None when it has none, unless
    ``always`` (a call with a block mask, whose partial tiles need the mask's rules)."""
    score_mod = check_mod(score_mod, "score_mod", 5)
    mask_mod = check_mod(mask_mod, "mask_mod", 4)
    if score_mod is None and mask_mod is None and not always:
        return None
    if base is not None and not isinstance(base, IndexBase):
        raise TypeError(f"_index_base must be a tinyflash.core.mods.IndexBase; got {type(base).__name__}")
    check_heads_layout(prob.lead, "score_mod, mask_mod or block_mask")
    return Mods(score_mod, mask_mod, tuple(prob.lead), prob.n_q, prob.n_k, prob.causal, base or NO_BASE,
                None if score_mod is None else dual_aware(score_mod))


def index_grids(mods: Mods, rows, cols):
    """(b, h, q_idx, kv_idx): int64 arrays (or scalars) that broadcast to (*lead, len(rows), len(cols)).

    ``rows`` and ``cols`` are positions in the call's Nq queries and Nk keys (a tile, or all)."""
    base, lead = mods.base, mods.lead
    q_idx = np.asarray(rows, dtype=np.int64)[:, None] + base.q  # (rows, 1)
    kv_idx = np.asarray(cols, dtype=np.int64)[None, :] + base.kv  # (1, cols)
    if len(lead) == 2:
        b = (base.batch + np.arange(lead[0], dtype=np.int64)).reshape(-1, 1, 1, 1)  # (B, 1, 1, 1)
        h = np.arange(lead[1], dtype=np.int64).reshape(1, -1, 1, 1)  # (1, H, 1, 1)
    elif len(lead) == 1:
        b = np.int64(base.batch)
        h = np.arange(lead[0], dtype=np.int64).reshape(-1, 1, 1)  # (H, 1, 1)
    else:
        b, h = np.int64(base.batch), np.int64(0)
    return b, h, q_idx, kv_idx


def evaluate(fn, args, *, dual: bool = False):
    """Call a mod on the broadcasting ``args`` at once, or element by element where it takes no arrays.

    Returns ``(result, per_element)``: the vector call's result (an array or a scalar), or, if it
    raised TypeError or ValueError (``math`` on an array, ``and``/``if`` on an array, a list
    indexed by an array) or NumPy's DeprecationWarning (an array taken as a scalar), a list of
    results over the broadcast shape in C order, each call made with NumPy scalars (so that
    float32 stays float32, as in the vector call). With ``dual``, the first argument (the scores)
    is passed as ``Dual(score, 1)`` and the results are Duals (or constants).
    """
    lift = (lambda s: Dual(s, np.ones_like(s))) if dual else (lambda s: s)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)
            return fn(lift(args[0]), *args[1:]), False
    except (TypeError, ValueError, DeprecationWarning):
        pass
    shape = np.broadcast_shapes(*(np.shape(a) for a in args))
    flat = [np.broadcast_to(a, shape).ravel() for a in args]  # each (n,), the elements in C order
    if dual:
        return [fn(Dual(s, 1.0), *idx) for s, *idx in zip(*flat)], True
    return [fn(*point) for point in zip(*flat)], True


def _grid(result, per_element, shape, dtype):
    """A mod's result as a writable array of ``shape`` (the vector call may give less: a scalar, (r, c))."""
    if per_element:
        return np.array(result, dtype=dtype).reshape(shape)
    out = np.asarray(result, dtype=dtype)
    return out if out.shape == shape else np.broadcast_to(out, shape).copy()


def keep_mask(mods: Mods, rows, cols):
    """Boolean, broadcasting to (*lead, len(rows), len(cols)): True where causal AND mask_mod keep the key."""
    keep = allowed(rows, cols, mods.n_q, mods.n_k) if mods.causal else np.ones((len(rows), len(cols)), bool)
    if mods.mask_mod is None:
        return keep  # (rows, cols)
    args = index_grids(mods, rows, cols)
    result, per_element = evaluate(mods.mask_mod, args)
    if per_element:
        result = np.array(result, dtype=bool).reshape(np.broadcast_shapes(*(np.shape(a) for a in args)))
    try:
        return keep & np.asarray(result, dtype=bool)  # (*lead or 1s, rows, cols): broadcasting, no copy of keep
    except (TypeError, ValueError) as exc:
        raise ValueError(f"mask_mod must return a bool for each (b, h, q_idx, kv_idx); got {result!r}") from exc


def _score_mod(mods: Mods, S, rows, cols, derivative: bool):
    """score_mod on S (*lead, r, c): the new scores, and d score_mod / d score (or None)."""
    b, h, q_idx, kv_idx = index_grids(mods, rows, cols)
    args = (S, b, h, q_idx, kv_idx)
    if not derivative:
        result, per_element = evaluate(mods.score_mod, args)
        return _grid(result, per_element, S.shape, S.dtype), None
    dual_mod = mods.dual_score_mod if mods.dual_score_mod is not None else dual_aware(mods.score_mod)
    result, per_element = evaluate(dual_mod, args, dual=True)  # math answered by dual numbers
    results = result if per_element else [result]
    values = [r.val if isinstance(r, Dual) else r for r in results]
    slopes = [r.der if isinstance(r, Dual) else 0.0 for r in results]  # a constant result: derivative 0
    if not per_element:
        values, slopes = values[0], slopes[0]
    return _grid(values, per_element, S.shape, S.dtype), _grid(slopes, per_element, S.shape, S.dtype)


def modified_scores(mods: Mods, S, rows, cols, *, mask: bool = True, derivative: bool = False):
    """The scores a stage uses: score_mod(S), then -inf where the key is not kept (if ``mask``).

    ``S``: the scaled scores of the query ``rows`` × key ``cols`` (positions in Nq, Nk), of shape
    (*lead, r, c) or its grouped-query view (..., H_kv, group, r, c), which is reshaped to q's
    heads and back. ``mask=False`` (a full tile of the block mask) skips the per-element mask.
    Returns ``(S, slope)``: the new scores, shaped like ``S``, and, with ``derivative``, d score_mod
    / d score of each (None without a score_mod, or without ``derivative``).
    """
    shape = S.shape
    S = S.reshape(*mods.lead, len(rows), len(cols))  # (*lead, r, c): q's heads, as the mods see them
    slope = None
    if mods.score_mod is not None:
        S, slope = _score_mod(mods, S, rows, cols, derivative)
    if mask and mods.masked:
        S = np.where(keep_mask(mods, rows, cols), S, -np.inf)  # (*lead, r, c)
    return S.reshape(shape), (None if slope is None else slope.reshape(shape))
