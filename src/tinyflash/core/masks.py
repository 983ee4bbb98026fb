"""The causal rule, written once.

Bottom-right alignment, as in FlashAttention >= 2.1 and PyTorch's ``is_causal`` for Nq == Nk:
the Nq queries are the last Nq of Nk tokens, so query i may attend key j iff

    j <= i + (Nk - Nq),   that is   j < key_stop(i + 1, Nq, Nk, causal=True).

:func:`key_stop` is that rule. It is plain Python on purpose: the NumPy stages call it with
Python ints, and every kernel compiles the very same lines as a device function (with
``tinyflash.gpu.runtime.device_function``) and calls it with unsigned 64-bit ints. So it takes an
exclusive bound (``q_stop = i + 1``, not ``i``), never forms a negative intermediate, which an
unsigned integer could not hold, and calls nothing (a device function cannot call plain Python).

Everything else is derived from it, in the same words everywhere: a query tile [q_start, q_end)
loads key tiles up to ``key_stop(q_end, ...)``; a key tile ending at k_end needs the mask only if
``k_end > key_stop(q_start + 1, ...)``, that is if it reaches past what the tile's first query,
which sees the fewest keys, may attend.
"""

from __future__ import annotations

import numpy as np


def key_stop(q_stop, n_q, n_k, causal):
    """Keys ``0 .. key_stop - 1`` may be attended by query row ``q_stop - 1``.

    Since a later query sees every key an earlier one sees, this is also the number of keys that
    any of the queries ``0 .. q_stop - 1`` may attend: for a query tile ending at ``q_end``,
    ``key_stop(q_end, ...)`` is where its loop over key tiles ends. Without ``causal``, every key:
    ``n_k``. With it, ``min(n_k, q_stop + n_k - n_q)``, and 0 when that is negative (more queries
    than keys: the first Nq - Nk queries see nothing).
    """
    if not causal:
        return n_k
    return min(n_k, max(q_stop + n_k, n_q) - n_q)


def allowed(query_rows, key_cols, n_q: int, n_k: int, xp=np):
    """Boolean (len(query_rows), len(key_cols)): True where the query may attend the key (causal).

    ``query_rows`` and ``key_cols`` are indices into the full Nq queries and Nk keys (any order,
    any subset, e.g. a tile or a sample of rows). ``xp`` is the array module of the result (NumPy,
    or CuPy for a mask on the GPU).
    """
    stops = [key_stop(int(i) + 1, n_q, n_k, True) for i in query_rows]  # (rows,) one rule per row
    stops = xp.asarray(np.asarray(stops, dtype=np.int64))[:, None]  # (rows, 1)
    return xp.asarray(np.asarray(key_cols, dtype=np.int64))[None, :] < stops  # (rows, cols)


def causal_mask(n_q: int, n_k: int, q_start: int = 0, k_start: int = 0, rows: int | None = None,
                cols: int | None = None) -> np.ndarray:
    """Boolean mask of allowed (query, key) pairs, True where query i may attend key j.

    The whole Nq × Nk mask, or with (``q_start``, ``rows``) × (``k_start``, ``cols``) one tile of it.
    """
    rows = n_q - q_start if rows is None else rows
    cols = n_k - k_start if cols is None else cols
    return allowed(range(q_start, q_start + rows), np.arange(k_start, k_start + cols), n_q, n_k)  # (rows, cols)
