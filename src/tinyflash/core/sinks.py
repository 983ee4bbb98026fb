"""Attention sinks (gpt-oss): a learned logit per head that joins each row's softmax without a value.

With sink logit σ_h for query head h, a row's softmax runs over its keys and the sink:

    p_j    = exp(s_j - lse),   p_sink = exp(σ_h - lse),   lse = log(Σ_j exp(s_j) + exp(σ_h))
    o      = Σ_j p_j v_j                                   (the sink has no value: the p_j sum to < 1)

So the sink is one more score per row whose value row is zero: stage 1 folds it into the online
softmax as a last chunk of one score and a zero value; stage 0 adds its term to the maximum and
the denominator. A row with no key but a sink gives o = 0 and lse = σ_h.

The gradient. The sink's "dP" is 0 (no value), so its dS is p_sink · (0 − D) with D = rowsum(dO ∘ O),
the D of every backward, and, summed over the rows (and the batch) of its head:

    dσ_h = − Σ_rows p_sink · D

The keys' gradients keep their formula: P recomputed from an lse that includes the sink is the
right P, and D is still Σ_j p_j dP_j.
"""

from __future__ import annotations

import numpy as np

from .heads import group_query_heads


def check_sinks(sinks, lead: tuple):
    """``sinks`` as a float array (H,), H the number of query heads (1 for q of shape (Nq, d)); or None."""
    if sinks is None:
        return None
    if len(lead) > 2:
        raise ValueError(f"sinks needs q of shape (Nq, d), (H, Nq, d) or (B, H, Nq, d); got leading dims {lead}")
    n_heads = lead[-1] if lead else 1
    if not hasattr(sinks, "shape"):
        try:
            sinks = np.asarray(sinks)
        except Exception as exc:
            raise TypeError(f"sinks must be a float array of shape ({n_heads},); got {type(sinks).__name__}") from exc
    if not isinstance(sinks, np.ndarray):
        raise TypeError(f"sinks must be a NumPy float array of shape ({n_heads},); got {type(sinks).__name__}")
    if sinks.dtype.kind != "f":
        raise TypeError(f"sinks must be a float array (one logit per query head); got dtype {sinks.dtype}")
    if sinks.shape != (n_heads,):
        raise ValueError(f"sinks must have shape ({n_heads},): one logit per query head; got {sinks.shape}")
    return sinks


def sink_scores(sinks, lead: tuple, kv_group: int, dtype):
    """The sinks as a column of scores, (*lead, 1, 1), or its grouped-query view (..., H_kv, group, 1, 1)."""
    per_head = (*([1] * (len(lead) - 1)), -1, 1, 1) if lead else (1, 1)  # (1.., H, 1, 1), or (1, 1) for q (Nq, d)
    column = np.broadcast_to(sinks.astype(dtype).reshape(per_head), (*lead, 1, 1))  # (*lead, 1, 1)
    return group_query_heads(column, kv_group)  # (..., H_kv, group, 1, 1) with grouped heads


def sink_gradient(sinks, lse, D, lead: tuple):
    """dσ (H,) = − Σ over rows and batch of exp(σ_h − lse) · D; lse, D: (*lead, Nq). Rows with lse = −inf: 0."""
    column = sink_scores(sinks, lead, 1, lse.dtype)[..., 0]  # (*lead, 1)
    lse_safe = np.where(lse == -np.inf, np.inf, lse)  # (*lead, Nq) a row with neither key nor sink: p_sink = 0
    per_row = -np.exp(column - lse_safe) * D  # (*lead, Nq)
    per_head = per_row.sum(axis=-1)  # (*lead,)
    if len(lead) == 2:
        per_head = per_head.sum(axis=0)  # (H,) summed over the batch
    return per_head.reshape(-1).astype(sinks.dtype)  # (H,)
