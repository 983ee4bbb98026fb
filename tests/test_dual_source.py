"""tinyflash.core.dual_source: a score_mod rewritten into (value, d value / d score), the backward kernel's derivative.

The value must be the user's function's, bit for bit (the same operations on the same float32 scalars, as a kernel
and the simulator compute them); the derivative that of the dual numbers the NumPy stages use
(``tinyflash.core.dual``), or, where they cannot follow (a helper that calls ``math``), central differences in
float64. What the rewriting does not support is a TypeError naming score_mod.
"""

import math

import numpy as np
import pytest

from tinyflash.core import variants
from tinyflash.core.dual import Dual, dual_aware
from tinyflash.core.dual_source import value_and_derivative


def steep(x, c):
    """A helper with a branch and math, called with an active first argument."""
    y = x * c
    if y > 1.0:
        y = y - 0.5
    return math.exp(-y)


def branches(score, b, h, q_idx, kv_idx):
    t = score * 0.5
    t += math.sin(score) if q_idx > kv_idx else abs(score)
    return max(t, score / 3.0) + steep(score, 1.5) + min(score, 2.0) ** 2


def either_return(score, b, h, q_idx, kv_idx):
    if score > 0:
        return math.sqrt(score + 1.0)
    else:
        return math.log1p(-score) * 2.0 - 1.0 / (score - 4.0)


def constant_past_a_point(score, b, h, q_idx, kv_idx):
    cut = score > 2.0
    return 2.0 if cut else score ** 3 - math.floor(score) + 2.0 ** score


MODS = {
    "softcap": variants.softcap(2.0),
    "alibi": variants.alibi(4),
    "relative bias": variants.relative_bias(np.linspace(-1, 1, 4 * 9).reshape(4, 9)),
    "branches and a helper": branches,
    "a return in each branch": either_return,
    "a constant branch, pow, floor": constant_past_a_point,
    "lambda": lambda s, b, h, q_idx, kv_idx: s + 0.5 * h - 0.75 * b * (kv_idx % 3) + math.tanh(s) * s,  # noqa: E731
}


@pytest.mark.parametrize("name", list(MODS))
def test_value_is_bitwise_and_derivative_is_the_duals(rng, name):
    fn = MODS[name]
    both = value_and_derivative(fn)
    dual = dual_aware(fn)
    for _ in range(200):
        s = np.float32(rng.standard_normal() * 3)
        b, h, q_idx, kv_idx = 0, int(rng.integers(4)), int(rng.integers(20)), int(rng.integers(20))
        value, slope = both(s, b, h, q_idx, kv_idx)
        plain = fn(s, b, h, q_idx, kv_idx)
        assert type(value) is type(plain) and (value == plain or (np.isnan(value) and np.isnan(plain))), (s, value,
                                                                                                        plain)
        assert type(slope) is np.float32
        try:
            found = dual(Dual(s, 1.0), b, h, q_idx, kv_idx)
            want = found.der if isinstance(found, Dual) else 0.0
        except TypeError:  # a helper's math takes no Dual: central differences in float64
            eps = 1e-6
            up, down = (fn(np.float64(s) + e, b, h, q_idx, kv_idx) for e in (eps, -eps))
            want = (up - down) / (2 * eps)
            assert abs(slope - want) <= 1e-4 * (1 + abs(want)), (name, s, slope, want)
            continue
        assert abs(slope - want) <= 2e-6 * (1 + abs(want)), (name, s, slope, want)


def test_helpers_go_through_the_device_compiler():
    """A helper's rewritten form is handed to ``device`` (a kernel calls device functions only)."""
    seen = []
    both = value_and_derivative(branches, device=lambda f: seen.append(f.__name__) or f)
    assert seen == ["steep_value_and_derivative"]
    assert both(np.float32(0.5), 0, 0, 1, 2)[0] == branches(np.float32(0.5), 0, 0, 1, 2)


def loop(score, b, h, q_idx, kv_idx):
    for _ in range(2):
        score = score * 0.5
    return score


def indexed(score, b, h, q_idx, kv_idx):
    return TABLE[int(score)]


def boolean_numbers(score, b, h, q_idx, kv_idx):
    return (score > 0 and score) or 1.0


def unknown_call(score, b, h, q_idx, kv_idx):
    return np.tanh(score)


def clash(score, b, h, q_idx, kv_idx):
    d_score = 2.0
    return score * d_score


TABLE = np.arange(4.0)


@pytest.mark.parametrize("fn, words", [
    (loop, "a For statement on an active number"),
    (indexed, "a Subscript of an active number"),
    (boolean_numbers, "an and/or whose value may be an active number"),
    (unknown_call, "the call np.tanh"),
    (clash, "uses the name d_score"),
    (eval("lambda s, b, h, q_idx, kv_idx: s"), "source of <lambda> is needed"),
    (math.tanh, "a plain Python function is needed"),
])
def test_what_is_not_supported_is_a_type_error(fn, words):
    with pytest.raises(TypeError, match=words):
        value_and_derivative(fn)


def test_two_lambdas_on_one_line():
    """The lambda whose names its code reads, of two on one line with the same parameters."""
    first, second = (lambda s, b, h, q, k: s * 2.0), (lambda s, b, h, q, k: math.exp(s))  # noqa: E731
    assert value_and_derivative(first)(np.float32(1.5), 0, 0, 0, 0) == (3.0, 2.0)
    value, slope = value_and_derivative(second)(np.float32(0.5), 0, 0, 0, 0)
    assert value == math.exp(np.float32(0.5)) and slope == np.float32(value)
