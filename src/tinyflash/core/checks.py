"""Input checks shared by every stage.

Every public attention function calls :func:`check_attention_inputs` first, so all stages accept
the same inputs and reject bad ones with the same messages. The checks read only ``.shape`` and
``.dtype`` (or, for a GPU array whose dtype NumPy does not know, such as a PyTorch tensor, the
``typestr`` of its ``__cuda_array_interface__``), so they work for NumPy arrays and for GPU arrays
(CuPy, numba, PyTorch) alike, and they import no GPU library.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

SUPPORTED_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
BFLOAT16 = "bfloat16"  # NumPy has no bfloat16: a stage that takes it lists this name in its allowed dtypes
BFLOAT16_STAGES = ("tinyflash.cuda_attention, tensor_core_attention, cuda_attention_backward, "
                   "tensor_core_attention_backward, cuda_split_kv_attention and cuda_paged_attention take it")


@dataclass(frozen=True)
class AttentionProblem:
    """What the checks found out about one call: shapes, dtypes and the softmax scale."""

    lead: tuple  # leading (batch, head, ...) dims of q (and of o, lse)
    n_q: int  # Nq, number of queries
    n_k: int  # Nk, number of keys (and values)
    d: int  # head dim of q and k
    d_v: int  # head dim of v (and of the output)
    dtype: np.dtype | str  # dtype of q, k, v and of the output o ('bfloat16', which NumPy lacks, by its name)
    compute_dtype: np.dtype  # dtype of the arithmetic: float32 for float16 inputs
    scale: float  # the softmax scale; 1/sqrt(d) unless given
    causal: bool
    kv_group: int = 1  # query heads per K/V head: H / H_kv (1: one K/V head per query head; H: MQA)

    @property
    def kv_lead(self) -> tuple:
        """Leading dims of k and v: the head axis (-3 of q) holds H / kv_group K/V heads."""
        if self.kv_group == 1:
            return self.lead
        return (*self.lead[:-1], self.lead[-1] // self.kv_group)

    @property
    def out_shape(self) -> tuple:
        return (*self.lead, self.n_q, self.d_v)

    @property
    def lse_shape(self) -> tuple:
        return (*self.lead, self.n_q)


FLOAT_NAMES = ("float16", "float32", "float64")  # PyTorch's names that NumPy shares


def _dtype_name(dt) -> str:
    return dt if isinstance(dt, str) else np.dtype(dt).name


def is_bfloat16(dtype) -> bool:
    """Whether ``dtype`` is bfloat16: PyTorch's ``torch.bfloat16``, or ml_dtypes' NumPy type (a 2-byte kind 'V')."""
    if isinstance(dtype, np.dtype):  # (a NumPy dtype's str() is slow: its kind is asked first)
        return dtype.kind == "V" and dtype.name == BFLOAT16
    return str(dtype).rsplit(".", 1)[-1] == BFLOAT16  # 'torch.bfloat16' -> 'bfloat16'


class _ExpectedNames:
    """'float16, float32': the allowed dtypes' names, spelled out only when an error message needs them
    (a dtype's name takes microseconds, at every call of every check)."""

    def __init__(self, allowed):
        self.allowed = allowed

    def __str__(self) -> str:
        return ", ".join(_dtype_name(a) for a in self.allowed)


def as_array(x, name: str):
    """Return ``x`` unchanged if it is an array (NumPy or GPU); else convert it with ``np.asarray``."""
    if hasattr(x, "__cuda_array_interface__") or isinstance(x, np.ndarray):
        return x
    if x is None:
        raise TypeError(f"{name} must be an array of shape (..., N, d); got None")
    try:
        return np.asarray(x)
    except Exception as exc:  # ragged lists and the like
        raise TypeError(f"{name} must be an array of shape (..., N, d); got {type(x).__name__}") from exc


def array_dtype(x, name: str, allowed=SUPPORTED_DTYPES) -> np.dtype | str:
    """The NumPy dtype of ``x``, checked against ``allowed``; :data:`BFLOAT16` (a name) for bfloat16.

    ``x.dtype`` if NumPy knows it; else, for a GPU array of another library (a PyTorch tensor's
    dtype is ``torch.float32``), the ``typestr`` of its ``__cuda_array_interface__``. bfloat16 has
    no NumPy dtype (PyTorch's interface says ``<V2``, raw bytes; ml_dtypes' is a kind 'V'): it is
    recognised by its name, and taken where ``allowed`` lists :data:`BFLOAT16`.
    """
    expected = _ExpectedNames(allowed)  # the names are only written into an error message
    if is_bfloat16(x.dtype):
        if BFLOAT16 not in allowed:
            raise TypeError(f"{name} has dtype {x.dtype}; expected one of {expected} ({BFLOAT16_STAGES})")
        return BFLOAT16
    try:
        dt = np.dtype(x.dtype)
    except TypeError:
        torch_name = str(x.dtype).removeprefix("torch.")  # torch.float16 -> 'float16', without its interface
        try:
            dt = np.dtype(torch_name if torch_name in FLOAT_NAMES else x.__cuda_array_interface__["typestr"])
        except Exception as exc:  # no interface, or one that cannot describe this array
            raise TypeError(f"{name} has dtype {x.dtype}, which NumPy does not know; expected one of "
                            f"{expected}") from exc
        if dt.kind != "f":  # e.g. '<V1': raw bytes, what PyTorch's interface says for its float8 types
            raise TypeError(f"{name} has dtype {x.dtype}; expected one of {expected} (no stage of tinyflash takes it)")
    if dt not in allowed:
        hint = ""
        if dt.kind in "biuf" and np.dtype(np.float32) in allowed:  # a number type: say how to convert it
            hint = (f". Convert it first: {name}.astype(np.float32) for an array, np.asarray({name}, dtype=np.float32) "
                    "for a list (NumPy's random generators give float64, and a Python list of floats becomes float64)")
        raise TypeError(f"{name} has dtype {dt.name}; expected one of {expected}{hint}")
    return dt


def check_positive_int(value, name: str) -> int:
    """Block sizes and the like: a positive Python or NumPy integer (not a bool)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a positive integer; got {value!r} of type {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be a positive integer; got {value}")
    return int(value)


def check_scale(scale, d: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(d)
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a real number or None; got {scale!r} of type {type(scale).__name__}")
    scale = float(scale)
    if not math.isfinite(scale) or scale <= 0.0:
        raise ValueError(f"scale must be finite and > 0 (None means 1/sqrt(d)); got {scale}")
    return scale


def check_causal(causal) -> bool:
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be True or False; got {causal!r} of type {type(causal).__name__}")
    return bool(causal)


def check_kv_heads(qs: tuple, ks: tuple, vs: tuple) -> int:
    """Grouped-query attention: the number of query heads per K/V head, from the shapes of q, k, v.

    q (..., H, Nq, d), k (..., H_kv, Nk, d), v (..., H_kv, Nk, dv): every leading dim but the
    head axis (-3) must match, and H must be a multiple of H_kv. H_kv = H is ordinary multi-head
    attention (group 1), 1 < H_kv < H grouped-query attention (GQA), H_kv = 1 multi-query (MQA).
    """
    if ks[:-2] != vs[:-2]:
        raise ValueError(f"k and v must have identical leading (batch, head, ...) dimensions; got k {ks}, v {vs}")
    if qs[:-2] == ks[:-2]:
        return 1
    if len(qs) < 3 or len(qs) != len(ks) or qs[:-3] != ks[:-3]:
        raise ValueError("q, k and v must have identical leading (batch, head, ...) dimensions, except that k "
                         f"and v may have fewer heads (axis -3) than q; got q {qs}, k {ks}, v {vs}")
    h, h_kv = qs[-3], ks[-3]
    if h_kv < 1 or h % h_kv != 0:
        raise ValueError(f"the number of query heads H (axis -3 of q) must be a multiple of the number of K/V "
                         f"heads H_kv (axis -3 of k and v); got q {qs} (H={h}) and k {ks} (H_kv={h_kv})")
    return h // h_kv


def check_attention_inputs(q, k, v, *, causal, scale, allowed=SUPPORTED_DTYPES) -> AttentionProblem:
    """Validate q (..., H, Nq, d), k (..., H_kv, Nk, d), v (..., H_kv, Nk, dv); return what was found.

    H_kv = H is ordinary attention; H_kv < H (a divisor of H) is grouped-query attention: query
    head h reads K/V head h // (H / H_kv) (:func:`check_kv_heads`).

    Raises TypeError for wrong types/dtypes and ValueError for wrong shapes or values, each
    message naming the argument, what was received and what is expected.
    """
    shapes, dtypes = {}, {}
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            raise TypeError(f"{name} must be an array of shape (..., N, d); got {type(x).__name__}")
        dtypes[name] = array_dtype(x, name, allowed)
        shapes[name] = tuple(int(n) for n in x.shape)  # a plain tuple, whatever the array library
        if len(shapes[name]) < 2:
            raise ValueError(f"{name} must have at least 2 dimensions (..., N, d); got shape {shapes[name]}")
    if not (dtypes["q"] == dtypes["k"] == dtypes["v"]):
        raise TypeError(f"q, k and v must share one dtype; got q {_dtype_name(dtypes['q'])}, "
                        f"k {_dtype_name(dtypes['k'])}, v {_dtype_name(dtypes['v'])}")
    qs, ks, vs = shapes["q"], shapes["k"], shapes["v"]
    kv_group = check_kv_heads(qs, ks, vs)
    n_q, d = qs[-2], qs[-1]
    n_k, d_k = ks[-2], ks[-1]
    n_v, d_v = vs[-2], vs[-1]
    if d != d_k:
        raise ValueError(f"q and k must have the same head dimension d (last axis); got q {qs} "
                         f"(d={d}) and k {ks} (d={d_k})")
    if d < 1:
        raise ValueError(f"q and k must have head dimension d >= 1; got d={d}")
    if d_v < 1:
        raise ValueError(f"v must have head dimension dv >= 1; got v {vs}")
    if n_k != n_v:
        raise ValueError(f"k and v must have the same number of keys Nk (axis -2); got k {ks} "
                         f"(Nk={n_k}) and v {vs} (Nk={n_v})")
    if n_k < 1:
        raise ValueError(f"k and v must hold at least one key (Nk >= 1); got k {ks}")
    dtype = dtypes["q"]
    compute = np.dtype(np.float64) if isinstance(dtype, np.dtype) and dtype == np.float64 else np.dtype(np.float32)
    return AttentionProblem(lead=qs[:-2], n_q=n_q, n_k=n_k, d=d, d_v=d_v, dtype=dtype, compute_dtype=compute,
                            scale=check_scale(scale, d), causal=check_causal(causal), kv_group=kv_group)


def check_like(x, name: str, shape: tuple, dtype, what: str):
    """The backward's extra inputs (``do``, ``o``, ``lse``): an array of exactly ``shape`` and ``dtype``.

    ``what`` says where the expectation comes from (e.g. "the shape of the forward's output o").
    """
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"{name} must be an array of shape {shape}; got {type(x).__name__}")
    got = tuple(int(n) for n in x.shape)
    if got != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)} ({what}); got {got}")
    dt = _dtype_name(array_dtype(x, name, (*SUPPORTED_DTYPES, BFLOAT16)))
    if dt != _dtype_name(dtype):
        raise TypeError(f"{name} must have dtype {_dtype_name(dtype)} ({what}); got {dt}")
    return x


def check_backward_inputs(prob: AttentionProblem, do, o=None, lse=None, *, grouped: bool = False) -> AttentionProblem:
    """The backward's inputs beyond q, k, v, against the problem ``check_attention_inputs`` found.

    do and o: (..., Nq, dv) in the dtype of q; lse: (..., Nq) in the compute dtype (float32, or
    float64 for float64 inputs), as the forward returns it. Grouped-query attention (fewer K/V
    heads than query heads) only where ``grouped`` (the tensor-core backward); elsewhere a clear ValueError.
    """
    if getattr(prob, "kv_group", 1) != 1 and not grouped:
        raise ValueError(f"the backward pass does not support grouped-query attention yet (q has "
                         f"{prob.kv_group} query heads per K/V head); repeat k and v to q's heads first, or use tinyflash.tensor_core_attention_backward")
    check_like(do, "do", prob.out_shape, prob.dtype, "the gradient of the output o: q's leading dims and Nq, "
               "v's dv, q's dtype")
    if o is not None:
        check_like(o, "o", prob.out_shape, prob.dtype, "the forward's output: q's leading dims and Nq, v's dv, "
                   "q's dtype")
    if lse is not None:
        check_like(lse, "lse", prob.lse_shape, prob.compute_dtype, "the forward's lse: q's leading dims and Nq, "
                   "float32 (float64 for float64 inputs)")
    return prob
