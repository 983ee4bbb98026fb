"""Every bad-input rule raises a clear error naming the argument, what it got and what it expects."""

import numpy as np
import pytest

import tinyflash as tf
from tinyflash.core.tolerance import assert_close

CPU_STAGES = [tf.naive_attention, tf.blocked_attention, tf.reference_attention]


def qkv(lead=(2,), n_q=5, n_k=6, d=4, d_v=4, dtype=np.float32):
    rng = np.random.default_rng()
    return (rng.standard_normal((*lead, n_q, d)).astype(dtype), rng.standard_normal((*lead, n_k, d)).astype(dtype),
            rng.standard_normal((*lead, n_k, d_v)).astype(dtype))


@pytest.fixture(params=CPU_STAGES, ids=lambda f: f.__name__)
def attention(request):
    return request.param


def test_wrong_ndim(attention):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"q must have at least 2 dimensions .*got shape \(4,\)"):
        attention(q[0, 0], k, v)


def test_mismatched_leading_dims(attention):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"identical leading .*got q \(2, 5, 4\), k \(6, 4\)"):
        attention(q, k[0], v[0])
    with pytest.raises(ValueError, match=r"identical leading"):
        attention(q, k, np.concatenate([v, v]))


def test_head_dim_mismatch(attention):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"same head dimension d .*\(d=4\) and k .*\(d=3\)"):
        attention(q, k[..., :3], v)


def test_key_value_length_mismatch(attention):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"same number of keys Nk .*Nk=6.*Nk=5"):
        attention(q, k, v[:, :5])


def test_no_keys(attention):
    q, k, v = qkv(n_k=0)
    with pytest.raises(ValueError, match=r"at least one key \(Nk >= 1\); got k \(2, 0, 4\)"):
        attention(q, k, v)


def test_zero_head_dims(attention):
    q, k, v = qkv(d=0)
    with pytest.raises(ValueError, match=r"head dimension d >= 1; got d=0"):
        attention(q, k, v)
    q, k, v = qkv(d_v=0)
    with pytest.raises(ValueError, match=r"v must have head dimension dv >= 1"):
        attention(q, k, v)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.complex64, object, bool])
def test_unsupported_dtypes(attention, dtype):
    q, k, v = qkv()
    with pytest.raises(TypeError, match=rf"q has dtype {np.dtype(dtype).name}; expected one of float16, float32, float64"):
        attention(q.astype(dtype), k.astype(dtype), v.astype(dtype))


def test_mixed_dtypes(attention):
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"share one dtype; got q float32, k float64, v float32"):
        attention(q, k.astype(np.float64), v)


def test_not_an_array(attention):
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"k must be an array of shape \(\.\.\., N, d\); got None"):
        attention(q, None, v)


@pytest.mark.parametrize("block", [0, -3])
@pytest.mark.parametrize("name", ["block_q", "block_k"])
def test_non_positive_block_sizes(name, block):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=rf"{name} must be a positive integer; got {block}"):
        tf.blocked_attention(q, k, v, **{name: block})


@pytest.mark.parametrize("block", [2.0, "16", True, None])
def test_non_integer_block_sizes(block):
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"block_q must be a positive integer; got"):
        tf.blocked_attention(q, k, v, block_q=block)


@pytest.mark.parametrize("scale", [0.0, -1.0, np.inf, -np.inf, np.nan])
def test_bad_scale_values(attention, scale):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"scale must be finite and > 0 .*got"):
        attention(q, k, v, scale=scale)


@pytest.mark.parametrize("scale", ["0.5", [0.5], True, 1j])
def test_bad_scale_types(attention, scale):
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"scale must be a real number or None; got"):
        attention(q, k, v, scale=scale)


@pytest.mark.parametrize("causal", [1, "yes", None])
def test_bad_causal(attention, causal):
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"causal must be True or False; got"):
        attention(q, k, v, causal=causal)


def test_explicit_scale_is_used(attention):
    q, k, v = qkv(dtype=np.float64)
    o, lse = attention(q, k, v, scale=0.1)
    o_ref, lse_ref = tf.naive_attention(q * 0.1 * np.sqrt(4), k, v)  # default scale is 1/sqrt(4)
    assert_close(o, o_ref, 1e-12, "o")
    assert_close(lse, lse_ref, 1e-12, "lse", is_lse=True)


def test_lists_are_accepted_as_arrays():
    q, k, v = qkv(lead=(), dtype=np.float64)
    o, lse = tf.naive_attention(q.tolist(), k.tolist(), v.tolist())
    np.testing.assert_array_equal(o, tf.naive_attention(q, k, v)[0])


class FakeDtype:
    """A dtype NumPy does not know, printed as PyTorch prints its own (``torch.float32``)."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return self.name


class FakeTorchTensor:
    """What a PyTorch CUDA tensor shows the checks: a shape, a dtype object NumPy does not know,
    and a ``__cuda_array_interface__`` whose typestr says what the elements are (PyTorch says
    ``<V2``, raw bytes, for bfloat16). No GPU memory behind it: only the checks may look."""

    def __init__(self, shape, dtype, typestr):
        self.shape, self.dtype = shape, FakeDtype(dtype)
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (0, False), "version": 2}


def test_gpu_tensors_whose_dtype_numpy_does_not_know():
    """PyTorch tensors' dtypes are read from their interface; bfloat16, which NumPy lacks, is taken by name where a
    stage takes it and refused elsewhere with the functions that take it; a type no stage takes says so."""
    from tinyflash.core.checks import SUPPORTED_DTYPES, check_attention_inputs
    from tinyflash.host.inputs import CUDA_CORES as SUPPORTED

    f32 = [FakeTorchTensor((2, 5, 8), "torch.float32", "<f4") for _ in range(3)]
    prob = check_attention_inputs(*f32, causal=False, scale=None, allowed=SUPPORTED)
    assert prob.dtype == np.float32 and prob.n_q == 5 and prob.lead == (2,)
    bf16 = [FakeTorchTensor((2, 5, 8), "torch.bfloat16", "<V2") for _ in range(3)]
    prob = check_attention_inputs(*bf16, causal=True, scale=None, allowed=SUPPORTED)
    assert prob.dtype == "bfloat16" and prob.compute_dtype == np.float32 and prob.causal and prob.n_q == 5
    with pytest.raises(TypeError, match=r"^q has dtype torch.bfloat16; expected one of float16, float32, float64 "
                                        r"\(tinyflash.cuda_attention, tensor_core_attention, cuda_attention_backward, "
                                        r"tensor_core_attention_backward, cuda_split_kv_attention and "
                                        r"cuda_paged_attention take it\)$"):
        check_attention_inputs(*bf16, causal=False, scale=None, allowed=SUPPORTED_DTYPES)
    fp8 = [FakeTorchTensor((2, 5, 8), "torch.float8_e4m3fn", "<V1") for _ in range(3)]
    with pytest.raises(TypeError, match=r"^q has dtype torch.float8_e4m3fn; expected one of float16, bfloat16, "
                                        r"float32 \(no stage of tinyflash takes it\)$"):
        check_attention_inputs(*fp8, causal=False, scale=None, allowed=SUPPORTED)
    mixed = [f32[0], FakeTorchTensor((2, 5, 8), "torch.float16", "<f2"), f32[2]]
    with pytest.raises(TypeError, match="^q, k and v must share one dtype; got q float32, k float16, v float32$"):
        check_attention_inputs(*mixed, causal=False, scale=None, allowed=SUPPORTED)
    with pytest.raises(TypeError, match="^q, k and v must share one dtype; got q bfloat16, k float32, v bfloat16$"):
        check_attention_inputs(bf16[0], f32[1], bf16[2], causal=False, scale=None, allowed=SUPPORTED)


# ---- every entry point's messages: the causal and scale errors in their own words, each dtype message naming
# ---- exactly the dtypes that entry point takes (the GPU entry points run on numba's simulator too: the checks
# ---- refuse before anything is launched)

CPU_DTYPES = "float16, float32, float64"
CUDA_CORE_DTYPES = "float16, bfloat16, float32"


def _entry_points():
    """(name, call(q, k, v, **kwargs), the start of its message for q of dtype int32), one per public function
    that takes q, k, v; q (1, 2, 3, 64), k and v (1, 2, 5, 64), float16 unless the test converts them."""
    from tinyflash.decode.paged import to_paged

    def backward(fn):  # o and lse of float16 copies: the checks of q come first
        return lambda q, k, v, **kw: fn(q, k, v, *tf.naive_attention(*(x.astype(np.float16) for x in (q, k, v))), q,
                                        **kw)

    def paged(fn):
        def call(q, k, v, **kw):
            cache = to_paged(k, v, np.array([5], np.int32), page_size=4)
            return fn(q, cache, **kw)
        return call

    tensor_cores = r"^{} takes float16 or bfloat16; got q of dtype int32 \(tinyflash.{} takes {} and float32\)$"
    return [
        ("naive_attention", tf.naive_attention, CPU_DTYPES),
        ("blocked_attention", tf.blocked_attention, CPU_DTYPES),
        ("reference_attention", tf.reference_attention, CPU_DTYPES),
        ("naive_attention_backward", lambda q, k, v, **kw: tf.naive_attention_backward(q, k, v, q, **kw), CPU_DTYPES),
        ("blocked_attention_backward", backward(tf.blocked_attention_backward), CPU_DTYPES),
        ("reference_attention_backward", lambda q, k, v, **kw: tf.reference_attention_backward(q, k, v, q, **kw),
         CPU_DTYPES),
        ("split_kv_attention", tf.split_kv_attention, CPU_DTYPES),
        ("paged_attention", paged(tf.paged_attention), CPU_DTYPES),
        ("cuda_attention", tf.cuda_attention, CUDA_CORE_DTYPES),
        ("cuda_attention_backward", backward(tf.cuda_attention_backward), CUDA_CORE_DTYPES),
        ("cuda_split_kv_attention", tf.cuda_split_kv_attention, CUDA_CORE_DTYPES),
        ("cuda_paged_attention", paged(tf.cuda_paged_attention), CUDA_CORE_DTYPES),
        ("tensor_core_attention", tf.tensor_core_attention,
         tensor_cores.format("tensor_core_attention", "cuda_attention", "float16, bfloat16")),
        ("tensor_core_attention_backward", backward(tf.tensor_core_attention_backward),
         tensor_cores.format("tensor_core_attention_backward", "cuda_attention_backward", "float16, bfloat16")),
    ]


ENTRY_POINTS = _entry_points()


def fp16_qkv():
    rng = np.random.default_rng()
    return [rng.standard_normal((1, 2, n, 64)).astype(np.float16) for n in (3, 5, 5)]


@pytest.mark.parametrize("name, call, dtypes", ENTRY_POINTS, ids=[e[0] for e in ENTRY_POINTS])
@pytest.mark.parametrize("causal", ["yes", 1, None])
def test_every_entry_point_names_a_bad_causal(name, call, dtypes, causal):
    with pytest.raises(TypeError, match=rf"^causal must be True or False; got {causal!r} of type "
                                        rf"{type(causal).__name__}$"):
        call(*fp16_qkv(), causal=causal)


@pytest.mark.parametrize("name, call, dtypes", ENTRY_POINTS, ids=[e[0] for e in ENTRY_POINTS])
def test_every_entry_point_names_a_bad_scale(name, call, dtypes):
    with pytest.raises(TypeError, match=r"^scale must be a real number or None; got 'big' of type str$"):
        call(*fp16_qkv(), scale="big")
    with pytest.raises(ValueError, match=r"^scale must be finite and > 0 \(None means 1/sqrt\(d\)\); got -1.0$"):
        call(*fp16_qkv(), scale=-1.0)


@pytest.mark.parametrize("name, call, dtypes", ENTRY_POINTS, ids=[e[0] for e in ENTRY_POINTS])
def test_every_entry_point_names_the_dtypes_it_takes(name, call, dtypes):
    if name == "reference_attention_backward":
        pytest.skip("the float64 reference of the backward takes any real array (PyTorch's bfloat16 too): it converts "
                    "its inputs to float64 first")
    q, k, v = (x.astype(np.int32) for x in fp16_qkv())
    expected = dtypes if dtypes.startswith("^") else rf"^q has dtype int32; expected one of {dtypes}\. Convert it first"
    with pytest.raises(TypeError, match=expected):
        call(q, k, v)
