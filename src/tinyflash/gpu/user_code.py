"""A user's plain Python function compiled into a kernel, and the key that says when two are the same.

numba-cuda compiles a device function into the kernel that calls it: a function is not a launch argument, so a
kernel that calls a user's function is built for that function (``cuda.jit(device=True)`` of it, taken by the
kernel factory at build time). numba also freezes what the function reads from outside as constants of the
compiled code: the numbers a closure captures, the module globals it names. So a kernel built for one function
serves another exactly when the two have the same code and read the same values, and that is the key of
:class:`UserFunction` (:func:`code_key`): two lambdas written at one place with equal captured numbers share a
kernel; a closure that captures a different number gets its own.

What a function may read from outside, and how it enters the key:

    numbers, bools, None, strings         by value (and type: 2 and 2.0 compile differently)
    NumPy arrays                          by dtype, shape and content (numba copies them into the kernel's
                                          constant memory: small tables, a relative bias, document ids;
                                          at most CONSTANT_BYTES in all)
    functions (plain Python)              by their own key: one user function may call another
    modules (``math``)                    by name
    tuples of these                       element by element

anything else is a TypeError naming the argument, before anything is compiled.
"""

from __future__ import annotations

import hashlib
import types
from dataclasses import dataclass, field

import numpy as np

MAX_DEPTH = 8  # functions that call functions: how deep the key follows them (deeper: a TypeError)
# the arrays a kernel's functions capture, in bytes: numba copies them into the module's constant memory, of which
# ptxas takes 64 KiB (``.const`` data, CUDA's limit on every GPU); 1 KiB is left for the kernel's own constants
CONSTANT_BYTES = 64 * 1024 - 1024


def _value_key(value, who: str, depth: int):
    """The key of one value a function reads from outside (module docstring), or a TypeError naming ``who``."""
    if value is None or isinstance(value, (bool, int, float, complex, str, np.number, np.bool_)):
        return (type(value).__name__, value)
    if isinstance(value, np.ndarray):
        digest = hashlib.sha1(np.ascontiguousarray(value).view(np.uint8).reshape(-1)).hexdigest()
        return ("array", value.dtype.str, value.shape, digest)
    if isinstance(value, types.ModuleType):
        return ("module", value.__name__)
    if isinstance(value, tuple):
        return ("tuple", tuple(_value_key(v, who, depth) for v in value))
    if isinstance(value, types.FunctionType):
        return ("function", code_key(value, who, depth + 1))
    if hasattr(value, "py_func"):  # a numba dispatcher (cuda.jit or numba.njit of a plain function)
        return ("function", code_key(value.py_func, who, depth + 1))
    raise TypeError(f"{who} reads a value of type {type(value).__name__} from outside ({value!r}); a function "
                    "compiled into a kernel may capture numbers, bools, strings, NumPy arrays, plain functions, "
                    "modules and tuples of these")


def code_key(fn, who: str, depth: int = 0) -> tuple:
    """What the compiled ``fn`` depends on: its code (the code object, which compares by content), the values its
    closure captures and the module globals it names (``who`` names the argument in errors)."""
    if not isinstance(fn, types.FunctionType):
        raise TypeError(f"{who} must be a plain Python function (def or lambda) that numba can compile; got "
                        f"{type(fn).__name__}")
    if depth > MAX_DEPTH:
        raise TypeError(f"{who} calls functions nested more than {MAX_DEPTH} deep")
    cells = tuple(_value_key(c.cell_contents, who, depth) for c in (fn.__closure__ or ()))
    names = global_names(fn.__code__)
    read = tuple((n, _value_key(fn.__globals__[n], who, depth)) for n in sorted(names) if n in fn.__globals__)
    defaults = tuple(_value_key(v, who, depth) for v in (fn.__defaults__ or ()))
    return fn.__code__, cells, read, defaults


def global_names(code) -> set:
    """The names a code object and the code objects nested in it (comprehensions, inner lambdas) may read as
    globals (``co_names`` holds attribute names too: a name that is no global is left out by the caller)."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= global_names(const)
    return names


@dataclass(frozen=True, eq=False)
class UserFunction:
    """A user's function and its key (:func:`code_key`): equal, and hashed alike, when the keys are, so that a
    kernel factory cached on it (``functools.lru_cache``) builds one kernel per distinct function."""

    fn: types.FunctionType
    key: tuple = field(repr=False)

    @classmethod
    def of(cls, fn, who: str) -> "UserFunction":
        return cls(fn, code_key(fn, who))

    def __eq__(self, other) -> bool:
        return isinstance(other, UserFunction) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    @property
    def constant_bytes(self) -> int:
        """The bytes of the NumPy arrays the function reads from outside (which numba puts in constant memory)."""
        return _array_bytes(self.key)

    @property
    def device(self):
        """The function as a device function (:func:`compiled`)."""
        return compiled(self.fn)


def compiled(fn):
    """A user's function (or one made from it, such as its derivative) as a device function, compiled once and
    inlined by LLVM into each call (``forceinline``): a function inlined into its callers' IR (``inline="always"``,
    as the kernels' own pieces are) would carry a copy of each array it captures into every call site, and a kernel
    calls it once per 16 × 8 tile."""
    from numba import cuda  # numba is imported on first use (tinyflash.gpu.where decides the simulator first)

    from .runtime import simulator_enabled

    return cuda.jit(device=True, **({} if simulator_enabled() else {"forceinline": True}))(fn)


def _array_bytes(key) -> int:
    """The bytes of the arrays in a key of :func:`code_key` (each entry ``("array", dtype, shape, digest)``)."""
    if not isinstance(key, tuple):
        return 0
    if len(key) == 4 and key[0] == "array":
        return np.dtype(key[1]).itemsize * int(np.prod(key[2]))
    return sum(_array_bytes(part) for part in key)


def check_constant_bytes(functions: dict) -> None:
    """A ValueError if the arrays that ``functions`` (name -> UserFunction or None) capture exceed CONSTANT_BYTES."""
    found = {name: f.constant_bytes for name, f in functions.items() if f is not None}
    if sum(found.values()) > CONSTANT_BYTES:
        raise ValueError(f"{' and '.join(found)} capture NumPy arrays of {sum(found.values()):,} bytes "
                         f"({', '.join(f'{n} {b:,}' for n, b in found.items())}); numba copies them into the kernel's "
                         f"constant memory, of which they may take {CONSTANT_BYTES:,} bytes: use a smaller dtype "
                         "(int16 document ids, float32 or float16 tables) or a smaller table")
