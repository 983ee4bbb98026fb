"""Forward-mode dual numbers: the derivative of a score modification, from the function alone.

The backward pass of a ``score_mod`` needs d score_mod / d score at every score. A dual number
carries a value and its derivative together, ``Dual(s, 1)`` standing for s + ε with ε² = 0:

    (a + a'ε) + (b + b'ε) = (a + b) + (a' + b')ε
    (a + a'ε) · (b + b'ε) = a·b + (a'·b + a·b')ε
    f(a + a'ε)            = f(a) + f'(a)·a'ε          (exp, log, tanh, sqrt, sin, ...)

so calling the user's function once with ``Dual(score, 1.0)`` returns ``Dual(f(score), f'(score))``:
the modified score and its derivative, with no second function to write and keep in step. The
value part is computed by exactly the operations the plain call makes, in the same order, so it
is bit-identical to the forward's modified score.

Arithmetic (``+ - * / **``, unary minus, ``abs``) and comparisons (on the value: ``if s > c``,
``min``, ``max`` work) are methods of :class:`Dual`. ``math.tanh(x)`` is a C function that
accepts only real numbers, so :func:`dual_aware` returns a copy of the user's function whose
``math`` (the module, or functions taken from it, in its globals or its closure) is answered by
:data:`DUAL_MATH`, which knows each function's derivative and passes plain numbers straight to
``math``. The user's function and its module are never modified. A helper that the mod calls in
turn keeps its own ``math``: the math calls belong in the mod's own body.

``val`` and ``der`` may be NumPy arrays (one call for a whole tile) or scalars; DUAL_MATH's
functions, like ``math``'s, take scalars only, so a mod that calls them is evaluated element by
element (``tinyflash.core.mods``).
"""

from __future__ import annotations

import math
import types

import numpy as np


class Dual:
    """A value and its derivative with respect to one input: ``val + der·ε``, ε² = 0."""

    __slots__ = ("val", "der")
    __hash__ = None  # == compares values (possibly arrays): no hash
    # NumPy defers to the Dual's own operators: ``h * s`` with h a NumPy array or scalar calls
    # Dual.__rmul__, instead of making an object array of Duals
    __array_ufunc__ = None

    def __init__(self, val, der=0.0):
        self.val = val
        self.der = der

    def __repr__(self) -> str:
        return f"Dual({self.val!r}, {self.der!r})"

    # arithmetic: the value line is the plain operation, in the same operand order
    def __add__(self, other):
        if isinstance(other, Dual):
            return Dual(self.val + other.val, self.der + other.der)
        return Dual(self.val + other, self.der)

    def __radd__(self, other):
        return Dual(other + self.val, self.der)

    def __sub__(self, other):
        if isinstance(other, Dual):
            return Dual(self.val - other.val, self.der - other.der)
        return Dual(self.val - other, self.der)

    def __rsub__(self, other):
        return Dual(other - self.val, -self.der)

    def __mul__(self, other):
        if isinstance(other, Dual):
            return Dual(self.val * other.val, self.der * other.val + self.val * other.der)
        return Dual(self.val * other, self.der * other)

    def __rmul__(self, other):
        return Dual(other * self.val, other * self.der)

    def __truediv__(self, other):
        if isinstance(other, Dual):  # (a/b)' = (a'·b - a·b') / b²
            return Dual(self.val / other.val, (self.der * other.val - self.val * other.der) / (other.val * other.val))
        return Dual(self.val / other, self.der / other)

    def __rtruediv__(self, other):  # (c/b)' = -c·b' / b²
        return Dual(other / self.val, -other * self.der / (self.val * self.val))

    def __pow__(self, other):
        if isinstance(other, Dual):  # (a^b)' = a^b · (b'·ln a + b·a'/a)
            value = self.val ** other.val
            return Dual(value, value * (other.der * _log(self.val) + other.val * self.der / self.val))
        return Dual(self.val ** other, other * self.val ** (other - 1) * self.der)

    def __rpow__(self, other):  # (c^b)' = c^b · ln c · b'
        value = other ** self.val
        return Dual(value, value * _log(other) * self.der)

    def __neg__(self):
        return Dual(-self.val, -self.der)

    def __pos__(self):
        return self

    def __abs__(self):  # |a|' = sign(a)·a' (0 at a = 0, as a subgradient)
        return Dual(abs(self.val), self.der * ((self.val > 0) * 1.0 - (self.val < 0) * 1.0))

    # comparisons look at the value only: branches and min/max follow the plain function's path
    def __lt__(self, other):
        return self.val < _value(other)

    def __le__(self, other):
        return self.val <= _value(other)

    def __gt__(self, other):
        return self.val > _value(other)

    def __ge__(self, other):
        return self.val >= _value(other)

    def __eq__(self, other):
        return self.val == _value(other)

    def __ne__(self, other):
        return self.val != _value(other)

    def __bool__(self):
        return bool(self.val)


def _value(x):
    return x.val if isinstance(x, Dual) else x


def _log(x):
    """ln of a scalar or an array value (``**`` takes either), for a derivative only."""
    return np.log(x)


def _unary(f, df):
    """A math function that also takes a Dual: f(a + a'ε) = f(a) + f'(a)·a'ε; plain numbers go to ``f``."""

    def apply(x):
        if isinstance(x, Dual):
            return Dual(f(x.val), df(x.val) * x.der)
        return f(x)

    apply.__name__ = f.__name__
    return apply


def _pow(x, y):
    """math.pow with duals: the same rule as ``**``, the value from math.pow."""
    if not isinstance(x, Dual) and not isinstance(y, Dual):
        return math.pow(x, y)
    result = Dual(x) ** y if not isinstance(x, Dual) else x ** y
    return Dual(math.pow(_value(x), _value(y)), result.der)


# each function of math that a score modification may use, with its derivative
_DERIVATIVES = {
    "exp": lambda a: math.exp(a),
    "expm1": lambda a: math.exp(a),
    "exp2": lambda a: math.exp2(a) * math.log(2.0),
    "log": lambda a: 1.0 / a,
    "log1p": lambda a: 1.0 / (1.0 + a),
    "log2": lambda a: 1.0 / (a * math.log(2.0)),
    "log10": lambda a: 1.0 / (a * math.log(10.0)),
    "sqrt": lambda a: 0.5 / math.sqrt(a),
    "tanh": lambda a: 1.0 - math.tanh(a) ** 2,
    "sinh": lambda a: math.cosh(a),
    "cosh": lambda a: math.sinh(a),
    "sin": lambda a: math.cos(a),
    "cos": lambda a: -math.sin(a),
    "tan": lambda a: 1.0 / math.cos(a) ** 2,
    "atan": lambda a: 1.0 / (1.0 + a * a),
    "asin": lambda a: 1.0 / math.sqrt(1.0 - a * a),
    "acos": lambda a: -1.0 / math.sqrt(1.0 - a * a),
    "erf": lambda a: 2.0 / math.sqrt(math.pi) * math.exp(-a * a),
    "fabs": lambda a: (a > 0) * 1.0 - (a < 0) * 1.0,
}

DUAL_MATH = types.SimpleNamespace(**{name: getattr(math, name) for name in dir(math) if not name.startswith("_")})
DUAL_MATH.__dict__.update({name: _unary(getattr(math, name), df) for name, df in _DERIVATIVES.items()})
DUAL_MATH.pow = _pow
_DUAL_OF = {id(getattr(math, name)): getattr(DUAL_MATH, name) for name in (*_DERIVATIVES, "pow")}


def _dual_of(value):
    """What stands for ``value`` in the dual-aware copy: DUAL_MATH for the math module, its dual version
    for a function of math, ``value`` itself otherwise."""
    if value is math:
        return DUAL_MATH
    return _DUAL_OF.get(id(value), value)


def dual_aware(fn):
    """A copy of the plain Python function ``fn`` whose ``math`` names take dual numbers.

    Its globals are a copy of ``fn``'s with ``math`` (and any ``from math import tanh``) answered by
    :data:`DUAL_MATH`; its closure's cells the same. Anything but a plain function (a builtin, a
    callable object) is returned as it is: its arithmetic works on duals, a ``math`` call in it
    raises TypeError.
    """
    if not isinstance(fn, types.FunctionType):
        return fn
    env = {name: _dual_of(value) for name, value in fn.__globals__.items()}
    closure = None
    if fn.__closure__ is not None:
        closure = tuple(types.CellType(_dual_of(cell.cell_contents)) if _has(cell) else cell
                        for cell in fn.__closure__)
    copy = types.FunctionType(fn.__code__, env, fn.__name__, fn.__defaults__, closure)
    copy.__kwdefaults__ = fn.__kwdefaults__
    return copy


def _has(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # an empty cell (a name the enclosing function has not bound yet)
        return False
    return True
