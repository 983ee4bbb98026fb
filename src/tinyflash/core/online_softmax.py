"""The online softmax: softmax of a row that is visited one chunk at a time.

For one query row, with the scores s arriving in chunks s_1, s_2, ... (and, for attention, the
matching value rows V_1, V_2, ...), carry three things from chunk to chunk:

    m_t = max(m_{t-1}, max(s_t))                                  running maximum
    l_t = exp(m_{t-1} - m_t) · l_{t-1} + sum(exp(s_t - m_t))      running denominator
    o_t = exp(m_{t-1} - m_t) · o_{t-1} + sum(exp(s_t - m_t) V_t)  running unnormalised output

starting from m_0 = -inf, l_0 = 0, o_0 = 0. After the last chunk, softmax(s) = exp(s - m)/l,
the attention output is o/l and the log-sum-exp is m + log(l). The factor exp(m_{t-1} - m_t)
puts what was summed against the old maximum on the scale of the new one.

Those three lines are written once, in :func:`online_softmax_update`, for any number of rows at
once: :class:`OnlineSoftmax` (one row, lesson 02) and stage 1 (:func:`tinyflash.blocked_attention`,
a tile of Br rows) both call it, and :func:`online_softmax_finish` turns the state into (O, lse).
The GPU kernels do the same arithmetic on registers, one phase per line of the update, in
base 2: with S2 = S · log2(e), exp(S - m) = exp2(S2 - m2), one hardware instruction (ex2.approx)
per score, and at the end lse = (m2 + log2(l)) · ln(2). LOG2E and LN2 below are those constants.

Two states over disjoint sets of keys merge by the same rescaling: a state (m, l, o) and
another (m', l', o') give m'' = max(m, m'), l'' = exp(m - m'')·l + exp(m' - m'')·l', and the
same weights for o. That is what split-KV decoding (``tinyflash.decode``) does with the partial
results of its splits. Finished partials (O_s, lse_s) are the states (lse_s, 1, O_s), so the
NumPy combine is :func:`online_softmax_update` itself, with one "score" lse_s and one "value"
O_s per split; the kernels call :func:`merge_weights`, the same rescaling for two scalars.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .checks import check_positive_int

LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x · LOG2E)
LN2 = 0.6931471805599453  # ln(2):   log(x) = log2(x) · LN2


@np.errstate(invalid="ignore")  # a NaN or +inf score makes its row NaN (inf - inf), without a warning
def online_softmax_update(m_i, l_i, acc, S_ij, V_j=None):
    """Fold one chunk of scores into the running state; return ``(m_i, l_i, acc, alpha)`` after it.

    m_i, l_i: (..., Br) running max and denominator; acc: (..., Br, dv) running unnormalised
    output (or None when no values are given); S_ij: (..., Br, Bc) scores of the chunk, -inf where
    masked; V_j: (..., Bc, dv) its values. alpha = exp(m_old - m_new) is what rescaled the old sums.
    A row that has seen only -inf so far keeps m = -inf and l = 0 (0 stands in for its max, so
    that exp(-inf - -inf) never occurs).
    """
    m_new = np.maximum(m_i, S_ij.max(axis=-1))  # (..., Br)      row max
    m_safe = np.where(m_new == -np.inf, 0.0, m_new)  # (..., Br)  rows with no allowed key yet
    P_ij = np.exp(S_ij - m_safe[..., None])  # (..., Br, Bc)  unnormalised probabilities
    alpha = np.exp(m_i - m_safe)  # (..., Br)      rescale: exp(m_old - m_new)
    l_i = alpha * l_i + P_ij.sum(axis=-1)  # (..., Br)
    if V_j is not None:
        acc = alpha[..., None] * acc + P_ij @ V_j  # (..., Br, dv)  P·V
    return m_new, l_i, acc, alpha


def merge_weights(m_a, m_b):
    """Merge two online-softmax states with maxima m_a, m_b (base 2, as in the kernels).

    Returns ``(m, alpha_a, alpha_b)``: the merged maximum m = max(m_a, m_b) and the factors
    exp2(m_a - m), exp2(m_b - m) that put each state's sums on its scale; l = alpha_a·l_a +
    alpha_b·l_b, and the same for acc. A state that has seen no allowed key has m = -inf and
    weight 0; when both have, both weights are 0. Scalars only: plain Python, so that the kernels
    compile these very lines (``tinyflash.gpu.runtime.device_function``), as they do the causal rule.
    """
    m = max(m_a, m_b)
    if m == -math.inf:  # neither state has seen an allowed key: avoid -inf - -inf
        return m, 0.0, 0.0
    return m, math.exp2(m_a - m), math.exp2(m_b - m)


def online_softmax_finish(m_i, l_i, acc=None):
    """The epilogue: ``(O, lse)`` = (acc / l, m + log l) from the final state; O = 0 and lse = -inf
    for rows that had no allowed key (l = 0). O: (..., Br, dv), None without acc; lse: (..., Br)."""
    with np.errstate(invalid="ignore", divide="ignore"):  # l_i == 0 only for fully masked rows
        O = None if acc is None else np.where(l_i[..., None] == 0, 0.0, acc / l_i[..., None])  # (..., Br, dv)
        lse = np.where(l_i == 0, -np.inf, m_i + np.log(l_i))  # (..., Br)
    return O, lse


@dataclass
class OnlineSoftmax:
    """The state (m, l[, o]) of one row's online softmax, updated chunk by chunk.

    >>> st = OnlineSoftmax()
    >>> st.update(np.array([1.0, 4.0]))
    0.0
    >>> st.m
    4.0
    """

    m: float = -np.inf  # running max of the scores seen so far
    l: float = 0.0  # running sum of exp(s - m) over the scores seen so far
    o: np.ndarray | None = None  # running sum of exp(s - m) · v (only if values are given)
    history: list = field(default_factory=list)  # (m, l, alpha) after each chunk, for printing

    def update(self, s_t, v_t=None) -> float:
        """Fold in one chunk of scores ``s_t`` (Bc,) and, optionally, values ``v_t`` (Bc, dv).

        Returns alpha = exp(m_old - m_new), the factor that rescaled the earlier sums.
        """
        s_t = np.asarray(s_t, dtype=np.float64)  # (Bc,)
        if s_t.ndim != 1 or s_t.size == 0:
            raise ValueError(f"s_t must be a non-empty 1-D chunk of scores; got shape {s_t.shape}")
        if v_t is not None:
            v_t = np.asarray(v_t, dtype=np.float64)  # (Bc, dv)
            if v_t.ndim != 2 or v_t.shape[0] != s_t.shape[0]:
                raise ValueError(f"v_t must have shape ({s_t.shape[0]}, dv) to match s_t; got {v_t.shape}")
            if self.o is None:
                self.o = np.zeros(v_t.shape[1])  # (dv,)
        m, l, o, alpha = online_softmax_update(np.float64(self.m), np.float64(self.l), self.o, s_t, v_t)
        self.m, self.l, self.o, alpha = float(m), float(l), o, float(alpha)
        self.history.append((self.m, self.l, alpha))
        return alpha

    @property
    def lse(self) -> float:
        """log(sum(exp(s))) over everything seen: m + log(l)."""
        return float(online_softmax_finish(np.float64(self.m), np.float64(self.l))[1])

    def output(self) -> np.ndarray:
        """The attention output o / l for the values seen so far."""
        if self.o is None:
            raise ValueError("no values were given to update(); pass v_t to accumulate an output")
        return online_softmax_finish(np.float64(self.m), np.float64(self.l), self.o)[0]


def online_softmax(x, chunk_size: int):
    """Softmax of a 1-D vector ``x`` visited in chunks of ``chunk_size``.

    Returns ``(p, state)``: the probabilities and the final :class:`OnlineSoftmax` state, whose
    ``history`` lists (m, l, alpha) after each chunk. The statistics (m, l) come from one pass
    over the chunks; computing p = exp(x - m) / l then needs x once more, which attention avoids
    by accumulating o instead (see :meth:`OnlineSoftmax.update` with values).
    """
    chunk_size = check_positive_int(chunk_size, "chunk_size")
    x = np.asarray(x, dtype=np.float64)  # (N,)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"x must be a non-empty 1-D vector; got shape {x.shape}")
    state = OnlineSoftmax()
    for start in range(0, x.size, chunk_size):
        state.update(x[start:start + chunk_size])  # one chunk: (chunk_size,) or fewer at the end
    p = np.exp(x - state.m) / state.l  # (N,)
    return p, state
