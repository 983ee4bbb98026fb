"""The registry type: every kernel version, forward, backward or decode, is one :class:`KernelVersion`.

A registry (``forward/kernels/__init__.py``, ``backward/kernels/__init__.py``, ``decode/kernels/__init__.py``) is a
:class:`Registry`: its versions in the order they were written, and its :class:`Default` rules, the one place that
says which version an entry point runs when a call names none, on which GPU. A version says what it takes
(:meth:`KernelVersion.accepts`), what it builds (``build``, a function of its file) and how it is sized (its
``tilings``); the host layer asks the registry and never imports a kernel's file. A lesson reads a kernel's code
through it too (:meth:`KernelVersion.source`).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Callable

import numpy as np

from ..gpu.runtime import compute_capability, simulator_enabled
from ..warp_tile import head_dims_text

SIXTEEN_BIT = ("float16", "bfloat16")
CUDA_CORE_DTYPES = ("float16", "bfloat16", "float32")  # computed in float32


def dtype_name(dtype) -> str:
    """'float16', 'bfloat16', 'float32', ...: a NumPy dtype's name, or the name itself."""
    return dtype if isinstance(dtype, str) else np.dtype(dtype).name


@dataclass(frozen=True, eq=False)
class KernelVersion:
    """One kernel version: where it is, what changed, what it takes, what it builds and how it is sized.

    ``build(tiling, dtype, **options)`` returns the version's numba kernel for one tiling and the inputs' dtype
    name (``'float16'``, ``'bfloat16'``, ``'float32'``); a decode split kernel's ``build(problem, page_size,
    **options)`` returns what its host needs (``decode.kernels.split.SplitKernel``). ``tilings`` are the functions
    that size it: (on a GPU, on numba's simulator[, a fallback that needs no permission for its shared memory]).
    ``arguments`` says what the kernel reads: ``'elements'`` (arrays of the inputs' type), ``'words'`` (16-bit
    values in pairs, as uint32 words) or ``'maps'`` (the TMA tensor maps of its tiles, ``gpu/tensor_map.py``).
    """

    name: str  # "v1", "v2", ...: the order in which they were written
    code: ModuleType  # its file: the kernel a learner reads
    changed: str  # one line on what it does, or what changed since the version before
    build: Callable
    tilings: tuple = ()
    signature: tuple | None = None  # its argument types for a launch through the driver; None: numba's only
    arguments: str = "elements"
    options: tuple = ()  # the keyword options a call may pass it
    dtypes: tuple = CUDA_CORE_DTYPES  # the input dtypes it takes, by name
    head_dims: tuple | None = None  # the only d (= dv) it takes; None: any d, dv up to max_head_dim
    max_head_dim: int | None = 256  # None: its build says which head dims it takes
    requirement: Callable | None = None  # requirement(who): raises where the GPU lacks its instructions
    # a backward's gradients that are bitwise identical from run to run (with deterministic=True where it has that mode)
    deterministic: tuple = ()
    stage: int | None = None  # 2: the CUDA cores, 3: the tensor cores (mma.sync), 4: Hopper's wgmma
    # takes FlexAttention's user functions and block mask (its build's score_mod, mask_mod, block_sparse)
    flex: bool = False
    flex_signature: tuple | None = None  # its flex kernel's argument types for a launch through the driver

    @property
    def module(self) -> str:
        """Its file's name, in its registry's folder: 'v5_branch_free.py'."""
        return self.code.__name__.rsplit(".", 1)[-1] + ".py"

    def accepts(self, dtype, d: int, d_v: int) -> bool:
        """Whether this version computes inputs of ``dtype`` (a NumPy dtype or a name) and head dims d, dv."""
        if self.head_dims:
            dims_ok = d == d_v and d in self.head_dims
        else:
            dims_ok = self.max_head_dim is None or max(d, d_v) <= self.max_head_dim
        return dtype_name(dtype) in self.dtypes and dims_ok

    def source(self, name: str | None = None) -> str:
        """The text of its file, or of one of its functions (``name``): what a lesson shows of a kernel."""
        return inspect.getsource(self.code if name is None else getattr(self.code, name))


@dataclass(frozen=True)
class Default:
    """A rule of which version ``entry`` (a public function's name) runs when a call names none: ``version``, where
    the GPU has exactly ``capability`` (None: any GPU, and numba's simulator) and the call's keyword arguments
    match ``when``. A registry's first rule for the entry that holds, and whose version takes the inputs, wins."""

    entry: str
    version: str
    capability: tuple | None = None
    when: dict = field(default_factory=dict)

    def holds(self, call: dict, capability: tuple | None = None) -> bool:
        """Whether the rule holds for a call with the keyword arguments ``call``, on a GPU of ``capability`` (None:
        the GPU this process runs kernels on; numba's simulator has none)."""
        if any(call.get(name) != value for name, value in self.when.items()):
            return False
        if self.capability is None:
            return True
        if capability is None:
            return not simulator_enabled() and compute_capability() == self.capability
        return tuple(capability) == self.capability


class Registry(Mapping):
    """The versions of one folder's kernels, by name, in the order they were written, and the rules of which runs
    by default (:class:`Default`). A mapping: ``VERSIONS["v5"]``, ``for name in VERSIONS``, ``VERSIONS.values()``."""

    def __init__(self, what: str, versions, defaults=()):
        self.what = what  # 'kernel', 'backward kernel', 'decode kernel': in errors
        self.versions = {v.name: v for v in versions}
        self.defaults = tuple(defaults)
        for rule in self.defaults:
            if rule.version not in self.versions:
                raise ValueError(f"the default rule {rule} names no version of this registry")

    def __getitem__(self, name) -> KernelVersion:
        return self.versions[name]

    def __iter__(self):
        return iter(self.versions)

    def __len__(self) -> int:
        return len(self.versions)

    def entries(self) -> list[str]:
        """The public functions that the rules speak for, in their order."""
        return list(dict.fromkeys(rule.entry for rule in self.defaults))

    def default(self, entry: str, dtype=None, d: int | None = None, d_v: int | None = None, *,
                capability: tuple | None = None, **call) -> KernelVersion:
        """The version ``entry`` runs when a call names none: the first rule that holds for this GPU (or, given, a GPU
        of ``capability``) and ``call`` (and, with ``dtype``, ``d``, ``d_v``, whose version takes them); a ValueError
        says why none does."""
        rules = [rule for rule in self.defaults if rule.entry == entry]
        if not rules:
            raise KeyError(f"no default rule for {entry!r}; the rules speak for {', '.join(self.entries())}")
        for rule in rules:
            version = self.versions[rule.version]
            if rule.holds(call, capability) and (dtype is None or version.accepts(dtype, d, d_v)):
                return version
        first = self.versions[rules[0].version]
        dims = f" with d = dv {head_dims_text(first.head_dims)}" if first.head_dims else ""
        raise ValueError(f"the {first.name} {self.what} takes {' or '.join(first.dtypes)}{dims}; got "
                         f"{dtype_name(dtype)}, d={d}, dv={d_v} (kernel=None: the first {self.what} that takes them)")

    def choose(self, name: str | None, entry: str | None = None, among=None, **call) -> KernelVersion:
        """The version ``name``, or for None ``entry``'s default (:meth:`default`); ``among``: the names the caller
        runs (None: all). A ValueError names them."""
        if name is None and entry is not None:
            return self.default(entry, **call)
        names = list(self.versions) if among is None else list(among)
        if name not in names:
            fallback = f" (None: {self.default_name(entry, **call)})" if entry else ""
            raise ValueError(f"kernel must be one of {', '.join(names)}{fallback}; got {name!r}")
        return self.versions[name]

    def default_name(self, entry: str, **call) -> str:
        """The name of ``entry``'s default for an error message: asked of the GPU only where one is there."""
        try:
            return self.default(entry, **call).name
        except Exception:  # no GPU to ask (an error message must not raise another)
            return f"the registry's rule for {entry}"

    def table(self) -> str:
        """The versions as a Markdown table: each version's file and what it changed (lesson 05 prints it)."""
        lines = ["| version | file | what changed |", "|---|---|---|"]
        lines += [f"| {v.name} | `{v.module}` | {v.changed} |" for v in self.versions.values()]
        return "\n".join(lines)
