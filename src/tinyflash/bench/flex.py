"""The masks and score modifications of the ``flex`` benchmark, each written for every peer that runs it.

A variant (``VARIANTS``) is one attention of FlexAttention's comparison, at B = 1, H = 32, causal:

    causal           no mask beyond the causal rule
    window-1024      a sliding window of 1,024 keys (Mistral)
    documents-8      8 documents packed into the sequence, each attending only to itself
    softcap-30       causal with the scores capped, 30 · tanh(s / 30) (Gemma 2)
    alibi            causal with ALiBi's per-head bias by distance (BLOOM)

``tinyflash_mods`` gives tinyflash's functions (``tinyflash.core.variants``, compiled into the kernel, also the
float64 reference's), ``torch_mods`` the same in PyTorch's ops for ``torch.compile(flex_attention)``, and
``dense_mask`` the boolean (Nq, Nk) mask of SDPA with an explicit mask, where the variant is a mask alone.
The peers (:func:`flex_peers`) time the forward, each named after the variant (the record's ``variant``; tinyflash's
v10 as "<variant> v10", beside v6's "<variant>"); the check compares sampled rows with the float64 reference under
the same functions (``checking.check_output``'s ``mods``).
"""

from __future__ import annotations

import numpy as np

from ..core.variants import alibi, document_mask, sliding_window, softcap
from .peers import Peer, sdpa_backend, torch_view

VARIANTS = ("causal", "window-1024", "documents-8", "softcap-30", "alibi")
WINDOW, DOCUMENTS, CAP = 1024, 8, 30.0


def document_ids(n: int) -> np.ndarray:
    """int8 ids of ``DOCUMENTS`` equal documents over n tokens (int8: the kernel keeps them as constants)."""
    return (np.arange(n) * DOCUMENTS // n).astype(np.int8)


def tinyflash_mods(name: str, n: int, heads: int) -> tuple:
    """(score_mod, mask_mod) of a variant, tinyflash's plain-Python closures (causal applies on top)."""
    return {"causal": (None, None), "window-1024": (None, sliding_window(WINDOW)),
            "documents-8": (None, document_mask(document_ids(n))), "softcap-30": (softcap(CAP), None),
            "alibi": (alibi(heads), None)}[name]


def torch_mods(name: str, n: int, heads: int, device) -> tuple:
    """(score_mod, mask_mod) of a variant in PyTorch's ops, causal included in the mask (FlexAttention's form)."""
    import torch

    from ..core.variants import alibi_slopes

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    if name == "window-1024":
        return None, lambda b, h, q_idx, kv_idx: (q_idx >= kv_idx) & (q_idx - kv_idx < WINDOW)
    if name == "documents-8":
        ids = torch.as_tensor(document_ids(n), device=device)
        return None, lambda b, h, q_idx, kv_idx: (q_idx >= kv_idx) & (ids[q_idx] == ids[kv_idx])
    if name == "softcap-30":
        return (lambda score, b, h, q_idx, kv_idx: CAP * torch.tanh(score / CAP)), causal
    if name == "alibi":
        slopes = torch.as_tensor(alibi_slopes(heads), dtype=torch.float32, device=device)
        return (lambda score, b, h, q_idx, kv_idx: score + slopes[h] * (kv_idx - q_idx)), causal
    return None, causal


def dense_mask(name: str, n: int) -> np.ndarray | None:
    """The (n, n) boolean mask of a variant that is a mask alone (with causal); None for a score modification."""
    q_idx, kv_idx = np.arange(n)[:, None], np.arange(n)[None, :]
    keep = kv_idx <= q_idx
    if name == "window-1024":
        return keep & (q_idx - kv_idx < WINDOW)
    if name == "documents-8":
        ids = document_ids(n)
        return keep & (ids[:, None] == ids[None, :])
    return keep if name == "causal" else None


def flex_tinyflash(name: str, kernel: str = "v6") -> Peer:
    """tinyflash.flex_attention on ``kernel`` (v6, stage 3's; v10, stage 4's on Hopper) with the variant's functions
    and a block mask built once (untimed). Named after the variant for v6, "<variant> v10" for v10."""
    def make(x):
        from ..core.block_mask import create_block_mask
        from ..forward.tensor_cores import flex_attention

        n, heads = x["n_q"], x["heads"]
        score_mod, mask_mod = tinyflash_mods(name, n, heads)
        bm = None if mask_mod is None else create_block_mask(mask_mod, 1, 1, n, n, causal=True)
        return lambda: flex_attention(x["q"], x["k"], x["v"], score_mod=score_mod, mask_mod=mask_mod, block_mask=bm,
                                      causal=True, kernel=kernel)[0]

    return Peer("tinyflash", name if kernel == "v6" else f"{name} {kernel}", make, ("float16", "bfloat16"))


def flex_torch(name: str) -> Peer:
    """PyTorch's FlexAttention, compiled (``torch.compile(flex_attention)``), with its own block mask built once."""
    def make(x):
        import torch
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        q, k, v = (torch_view(x[key]) for key in ("q", "k", "v"))
        n, heads = x["n_q"], x["heads"]
        score_mod, mask_mod = torch_mods(name, n, heads, q.device)
        bm = create_block_mask(mask_mod, None, None, n, n, device=q.device)
        compiled = torch.compile(flex_attention)
        return lambda: compiled(q, k, v, score_mod=score_mod, block_mask=bm)

    return Peer("torch_flex", name, make, ("float16", "bfloat16"))


def sdpa_masked(name: str) -> Peer:
    """SDPA given the variant's dense boolean mask (the efficient or cuDNN backend: flash takes no mask)."""
    def make(x):
        import torch
        import torch.nn.functional as F

        q, k, v = (torch_view(x[key]) for key in ("q", "k", "v"))
        mask = torch.as_tensor(dense_mask(name, x["n_q"]), device=q.device)  # (N, N) bool
        return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    return Peer("torch_efficient", f"mask {name}", make, ("float16", "bfloat16"), sdpa_backend("efficient"))


def varlen_documents() -> Peer:
    """tinyflash.varlen_attention on the documents of ``documents-8`` packed end to end (FlashAttention's layout, made
    untimed): one launch over the packed row; o returned as a (1, H, N, d) view for the check."""
    def make(x):
        from ..forward.varlen import varlen_attention

        q, k, v = (torch_view(x[key])[0].transpose(0, 1).contiguous() for key in ("q", "k", "v"))  # (N, H, d)
        cu = np.flatnonzero(np.diff(document_ids(x["n_q"]), prepend=-1, append=-1)).astype(np.int32)  # (9,)
        return lambda: varlen_attention(q, k, v, cu, cu, causal=True)[0].transpose(0, 1).unsqueeze(0)

    return Peer("tinyflash", "varlen documents-8", make, ("float16", "bfloat16"))


def padded_documents() -> Peer:
    """SDPA flash on the documents of ``documents-8`` as a padded batch (B = 8; the documents are of equal length,
    so nothing is padded here: the batch is what padding to the longest gives at best)."""
    def make(x):
        import torch.nn.functional as F

        q, k, v = (torch_view(x[key]) for key in ("q", "k", "v"))  # (1, H, N, d)
        _, heads, n, d = q.shape
        q, k, v = (t[0].reshape(t.shape[1], DOCUMENTS, n // DOCUMENTS, d).transpose(0, 1).contiguous()
                   for t in (q, k, v))  # (8, H, N / 8, d)
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(0, 1).reshape(
            1, heads, n, d)

    return Peer("torch_flash", "padded documents-8", make, ("float16", "bfloat16"), sdpa_backend("flash"))


def flex_peers(point) -> list:
    """FlexAttention compiled (the baseline), tinyflash.flex_attention on v6 (and on Hopper on v10, its default
    there), SDPA with the dense mask where the variant is a mask; for plain causal attention also tinyflash's own
    kernels (v6, and stage 4 on Hopper); for the documents also tinyflash.varlen_attention on them packed (on the
    default flex version) and SDPA flash on them as a batch of 8."""
    from . import peers as p
    from ..forward.kernels.hopper_tiling import COMPUTE_CAPABILITY
    from ..gpu.runtime import compute_capability

    name = point["mods"]
    hopper = compute_capability() == COMPUTE_CAPABILITY
    found = [flex_torch(name), flex_tinyflash(name)] + ([flex_tinyflash(name, "v10")] if hopper else [])
    if dense_mask(name, 1) is not None:
        found.append(sdpa_masked(name))
    if name == "documents-8":  # the same documents packed (varlen) and padded into a batch
        found += [varlen_documents(), padded_documents()]
    if name == "causal":
        found.append(p.stage3())
        if hopper:
            found.append(p.stage4())
    return found
