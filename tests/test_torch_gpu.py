"""tinyflash.torch as a model uses it (``pytest -m gpu``): the custom operators under PyTorch's own checks,
``torch.compile(fullgraph=True)``, a training step captured in a CUDA graph and replayed on new data, and
the kernels ordered on a side stream. Gradients against float64 are in test_backward_gpu.py and
test_backward_tensor_cores_gpu.py."""

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


def leaves(seed, heads=4, kv_heads=2, n=300, d=64, dtype=torch.bfloat16):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(2, heads, n, d, device="cuda", generator=gen).to(dtype)
    k, v = (torch.randn(2, kv_heads, n, d, device="cuda", generator=gen).to(dtype) for _ in range(2))
    do = torch.randn(q.shape, device="cuda", generator=gen).to(dtype)
    return q, k, v, do


def step(q, k, v, do, attention):
    """One forward and backward: (o, dq, dk, dv)."""
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    o = attention(q, k, v)
    o.backward(do)
    return o.detach(), q.grad, k.grad, v.grad


def assert_same_step(a, b):
    """o, dk and dv bit for bit (each written by one thread block); dq within rounding (added by atomics)."""
    for name, x, y in zip(("o", "dk", "dv"), (a[0], a[2], a[3]), (b[0], b[2], b[3])):
        assert torch.equal(x, y), name
    dq_a, dq_b = a[1].float(), b[1].float()
    assert float((dq_a - dq_b).abs().max()) <= 2 * float(dq_b.abs().max()) * 2.0**-7  # a bfloat16 rounding each way


def captured(training_step):
    """``training_step()`` (it returns its output) run twice on a side stream (the kernels compiled, the plans
    sized), then captured in a CUDA graph: (graph, the captured output)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            training_step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = training_step()
    return graph, out


def test_the_operators_pass_torch_library_opcheck(rng):
    """PyTorch's own checks of a custom operator: its schema, its fake implementation against the real one,
    its autograd registration."""
    import tinyflash.torch as tft

    q, k, v, do = leaves(int(rng.integers(2**31)))
    tests = ("test_schema", "test_autograd_registration", "test_faketensor")
    torch.library.opcheck(tft.attention_forward, (q, k, v, True, None, False), test_utils=tests)
    o, lse = tft.attention_forward(q, k, v, True, None, False)
    torch.library.opcheck(tft.attention_backward, (q, k, v, o, lse, do, True, None, True), test_utils=tests)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_torch_compile_fullgraph(rng, dtype):
    """A block of attention and a projection compiled whole: no graph break, the same step as eager."""
    import tinyflash.torch as tft

    q, k, v, do = leaves(int(rng.integers(2**31)), dtype=dtype)
    w = torch.randn(64, 64, device="cuda", dtype=dtype) * 0.1

    def block(q, k, v):
        return tft.attention(q, k, v, causal=True) @ w

    eager = step(q, k, v, do, block)
    compiled = step(q, k, v, do, torch.compile(block, fullgraph=True))
    assert_same_step(compiled, eager)


@pytest.mark.smoke  # the GPU smoke tier: this entry point on device arrays
def test_a_training_step_captured_in_a_cuda_graph(rng):
    """Forward and backward captured once, replayed on new inputs copied into the captured buffers: the
    replay computes what an eager step on those inputs computes."""
    import tinyflash.torch as tft

    seed = int(rng.integers(2**31))
    q, k, v, do = leaves(seed)
    static = [x.clone().requires_grad_() for x in (q, k, v)]
    static_do = do.clone()

    def captured_step():
        for x in static:
            x.grad = None
        o = tft.attention(*static, causal=True)
        o.backward(static_do)
        return o

    graph, static_o = captured(captured_step)
    new = leaves(seed + 1)
    with torch.no_grad():
        for x, y in zip((*static, static_do), new):
            x.copy_(y)
    graph.replay()
    torch.cuda.synchronize()
    eager = step(*new, lambda q, k, v: tft.attention(q, k, v, causal=True))
    assert_same_step((static_o.detach(), *(x.grad for x in static)), eager)


def test_a_step_whose_attention_inputs_are_made_inside_the_graph(rng):
    """q, k, v projected inside the capture (a model's activations: tensors of the graph's own memory pool, at
    addresses no eager call has seen, so stage 4's and backward v4's tensor maps are written into the graph),
    replayed on a new input: the same step as eager."""
    import tinyflash.torch as tft

    seed = int(rng.integers(2**31))
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(2, 300, 256, device="cuda", generator=gen).to(torch.bfloat16)
    w = (torch.randn(256, 3 * 256, device="cuda", generator=gen) * 0.05).to(torch.bfloat16).requires_grad_()
    do = torch.randn(2, 4, 300, 64, device="cuda", generator=gen).to(torch.bfloat16)

    def model_step():
        w.grad = None
        q, k, v = (t.view(2, 300, 4, 64).transpose(1, 2).contiguous() for t in (x @ w).split(256, dim=-1))
        o = tft.attention(q, k, v, causal=True)
        o.backward(do)
        return o

    graph, static_o = captured(model_step)
    with torch.no_grad():
        x.copy_(torch.randn(x.shape, device="cuda", generator=gen).to(torch.bfloat16))
    graph.replay()
    torch.cuda.synchronize()
    replayed = (static_o.detach().clone(), w.grad.detach().clone())
    eager_o = model_step()
    torch.cuda.synchronize()
    assert torch.equal(replayed[0], eager_o.detach())  # each output row written by one thread block
    dw, eager_dw = replayed[1].float(), w.grad.float()  # through dq (atomics): within rounding
    assert float((dw - eager_dw).abs().max()) <= 2.0**-6 * float(eager_dw.abs().max())


def test_a_capture_off_the_tensor_cores_is_refused_clearly(rng):
    """float32 runs on the CUDA cores, launched by numba on the default stream, which a capture forbids:
    a RuntimeError that says so, and the process still works after it."""
    import tinyflash.torch as tft

    q, k, v, _ = leaves(int(rng.integers(2**31)), heads=2, kv_heads=2, dtype=torch.float32)
    tft.attention(q, k, v)  # compiled before the capture
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="captured in a CUDA graph only on the tensor cores"):
        with torch.cuda.graph(graph):
            tft.attention(q, k, v)
    torch.cuda.synchronize()
    assert torch.isfinite(tft.attention(q, k, v)).all()


def test_the_kernels_run_on_pytorch_s_current_stream(rng):
    """Inputs made on a side stream and used at once on it, without a synchronisation: the kernels are ordered
    after the work that writes their inputs only if they launch on that stream."""
    import tinyflash.torch as tft

    seed = int(rng.integers(2**31))
    q, k, v, do = leaves(seed, n=2000, d=128, dtype=torch.float16)
    expected = step(q, k, v, do, lambda q, k, v: tft.attention(q, k, v, causal=True))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # the side stream is busy for tens of ms before it writes the inputs
        inputs = [x * 1 for x in (q, k, v, do)]  # copies, written on the side stream after the sleep
        got = step(*inputs, lambda q, k, v: tft.attention(q, k, v, causal=True))
    torch.cuda.synchronize()
    assert_same_step(got, expected)


def test_bad_arguments_are_named():
    import tinyflash.torch as tft

    q = torch.randn(1, 1, 8, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(TypeError, match="causal must be a bool; got str"):
        tft.attention(q, q, q, causal="yes")
    with pytest.raises(TypeError, match="scale must be a float or None; got str"):
        tft.attention(q, q, q, scale="0.1")
    with pytest.raises(TypeError, match="k must be a CUDA torch.Tensor; got Tensor on cpu"):
        tft.attention(q, q.cpu(), q)
    with pytest.raises(TypeError, match="deterministic must be a bool; got int"):
        tft.attention(q, q, q, deterministic=1)
    with pytest.raises(ValueError, match="deterministic=True needs the tensor cores"):
        tft.attention(q.float(), q.float(), q.float(), deterministic=True)


def test_deterministic_training_steps_are_bitwise_equal(rng):
    """deterministic=True: two training steps on the same inputs give the same q.grad, bit for bit."""
    import tinyflash.torch as tft

    q, k, v, do = leaves(int(rng.integers(2**31)), heads=8, kv_heads=2, n=3000, d=128)
    attention = lambda q, k, v: tft.attention(q, k, v, causal=True, deterministic=True)  # noqa: E731
    first, second = step(q, k, v, do, attention), step(q, k, v, do, attention)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


@pytest.mark.parametrize("d", [96, 192])
def test_other_head_dims_train_on_the_tensor_cores(rng, d):
    """d = 96 and 192 (neither 64 nor 128, nor a head dim of stage 4's forward), grouped K/V heads, float16 and
    bfloat16: the forward is tensor_core_attention's and the backward tensor_core_attention_backward's on the same
    o and lse, bit for bit (deterministic=True: dq too). A padded head dim (d = 200) the same way."""
    import tinyflash as tf
    import tinyflash.torch as tft

    for dtype, dim in ((torch.float16, d), (torch.bfloat16, d), (torch.float16, 200)):
        q, k, v, do = leaves(int(rng.integers(2**31)), heads=4, kv_heads=2, n=300, d=dim, dtype=dtype)
        o, dq, dk, dv = step(q, k, v, do, lambda q, k, v: tft.attention(q, k, v, causal=True, deterministic=True))
        o_tc, lse_tc = tf.tensor_core_attention(q, k, v, causal=True)
        assert torch.equal(o, o_tc)
        grads = tf.tensor_core_attention_backward(q, k, v, o_tc, lse_tc, do, causal=True, deterministic=True)
        assert all(torch.equal(a, b) for a, b in zip((dq, dk, dv), grads)), (dtype, dim)


def test_the_forward_is_stage_4_on_hopper(rng):
    """The forward that autograd runs is the fastest that takes the inputs: on a Hopper GPU at d = 64, 128 and 256,
    hopper_attention's o and lse bit for bit (grouped K/V heads, causal), elsewhere tensor_core_attention's."""
    import tinyflash as tf
    import tinyflash.torch as tft
    from tinyflash.gpu.runtime import compute_capability

    fastest = tf.hopper_attention if compute_capability() == (9, 0) else tf.tensor_core_attention
    for d, dtype in ((64, torch.bfloat16), (128, torch.float16), (256, torch.bfloat16)):
        q, k, v, _ = leaves(int(rng.integers(2**31)), heads=4, kv_heads=2, n=1000, d=d, dtype=dtype)
        o, lse = tft.attention_forward(q, k, v, True, None, False)
        o_ref, lse_ref = fastest(q, k, v, causal=True)
        assert torch.equal(o, o_ref) and torch.equal(lse, lse_ref)
