"""The online softmax: softmax of a row that is visited one chunk at a time.

For one query row, with the scores s arriving in chunks s_1, s_2, ... (and, for attention, the
matching value rows V_1, V_2, ...), carry three things from chunk to chunk:

    m_t = max(m_{t-1}, max(s_t))                                  running maximum
    l_t = exp(m_{t-1} - m_t) · l_{t-1} + sum(exp(s_t - m_t))      running denominator
    o_t = exp(m_{t-1} - m_t) · o_{t-1} + sum(exp(s_t - m_t) V_t)  running unnormalised output

starting from m_0 = -inf, l_0 = 0, o_0 = 0. After the last chunk, softmax(s) = exp(s - m)/l,
the attention output is o/l and the log-sum-exp is m + log(l). The factor exp(m_{t-1} - m_t)
puts what was summed against the old maximum on the scale of the new one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ._checks import check_positive_int


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
        m_new = max(self.m, float(s_t.max()))
        m_safe = 0.0 if m_new == -np.inf else m_new  # nothing seen but -inf: keep exp well defined
        alpha = float(np.exp(self.m - m_safe))  # exp(m_old - m_new); 0 on the first chunk
        p_t = np.exp(s_t - m_safe)  # (Bc,)
        self.l = alpha * self.l + float(p_t.sum())
        if v_t is not None:
            v_t = np.asarray(v_t, dtype=np.float64)  # (Bc, dv)
            if v_t.ndim != 2 or v_t.shape[0] != s_t.shape[0]:
                raise ValueError(f"v_t must have shape ({s_t.shape[0]}, dv) to match s_t; got {v_t.shape}")
            o_old = np.zeros(v_t.shape[1]) if self.o is None else self.o
            self.o = alpha * o_old + p_t @ v_t  # (dv,)
        self.m = m_new
        self.history.append((self.m, self.l, alpha))
        return alpha

    @property
    def lse(self) -> float:
        """log(sum(exp(s))) over everything seen: m + log(l)."""
        return -np.inf if self.l == 0 else self.m + float(np.log(self.l))

    def output(self) -> np.ndarray:
        """The attention output o / l for the values seen so far."""
        if self.o is None:
            raise ValueError("no values were given to update(); pass v_t to accumulate an output")
        return self.o / self.l


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
