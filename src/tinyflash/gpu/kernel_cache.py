"""Compiled kernels kept on disk, so that a new process does not compile them again.

numba compiles a kernel the first time it is launched in a process: for the tensor-core kernels, seconds
(Python to LLVM IR to PTX to a cubin), at every start of every program, lesson and test run. The kernels
launched through the driver (``driver_launch.DriverKernel``) are kept here instead, as the cubin numba
linked, under a key that changes whenever anything that went into it may have changed:

* the source of every module of the tinyflash package (an edit anywhere, an inline-PTX intrinsic in
  ``gpu/ptx.py`` included, makes every key new: the cache never serves a kernel from other code);
* the kernel: its function's name, and every value it closes over (tile sizes, the element type, the
  device functions and intrinsics it calls, with theirs), as ``make_kernel`` built it;
* the argument types, numba's compile options, the GPU's compute capability, and the versions of
  numba-cuda, numba and the CUDA driver.

numba's own ``cache=True`` is not used: it keys a kernel by its own file, so it does not see an edit to an
intrinsic in another file, and the kernels here are built in closures (one per tiling).

Where: ``$TINYFLASH_KERNEL_CACHE`` if set (a folder; ``off`` turns the cache off), else
``$XDG_CACHE_HOME/tinyflash/kernels`` (``~/.cache/tinyflash/kernels``). Each kernel is two files, its cubin
and a small JSON (its entry point, its key's parts); nothing is ever deleted: remove the folder to empty
it. A file that cannot be read or written is skipped (the kernel is compiled as without a cache); two
processes writing one kernel at once write the same bytes, each through its own temporary file.
"""

from __future__ import annotations

import hashlib
import json
import marshal
import os
import tempfile
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace

import numpy as np

ENV = "TINYFLASH_KERNEL_CACHE"
PACKAGE = Path(__file__).resolve().parents[1]  # src/tinyflash

_source_hash: str | None = None
stats = {"hits": 0, "misses": 0}  # this process's lookups, for the tests and the cold-start benchmark


def cache_dir() -> Path | None:
    """The cache's folder, or None when ``$TINYFLASH_KERNEL_CACHE`` is ``off``."""
    setting = os.environ.get(ENV, "")
    if setting.lower() == "off":
        return None
    if setting:
        return Path(setting).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tinyflash" / "kernels"


def source_hash() -> str:
    """SHA-256 of every ``.py`` file of the package, path and bytes, in a fixed order (once per process)."""
    global _source_hash
    if _source_hash is None:
        h = hashlib.sha256()
        for path in sorted(PACKAGE.rglob("*.py")):
            h.update(str(path.relative_to(PACKAGE)).encode() + b"\0" + path.read_bytes() + b"\0")
        _source_hash = h.hexdigest()
    return _source_hash


def fingerprint(obj, seen=None) -> str:
    """A text that names what ``obj`` compiles to, for what a closure holds, the same in every process: a numba
    dispatcher or intrinsic by its Python function; a function by its qualified name, its closure's values and its
    defaults (each fingerprinted in turn), and one from outside the package by its code and the globals it reads
    too; a NumPy array by its bytes; containers by their items (sets sorted: their order changes from process
    to process); an object whose ``repr`` is its address by its type and attributes; anything else by ``repr``
    (numbers, strings, numba types, the tilings' dataclasses)."""
    seen = set() if seen is None else seen
    if isinstance(obj, (set, frozenset)):
        return "{" + ", ".join(sorted(fingerprint(x, seen) for x in obj)) + "}"
    if isinstance(obj, (list, tuple)):
        return f"{type(obj).__name__}(" + ", ".join(fingerprint(x, seen) for x in obj) + ")"
    if isinstance(obj, dict):
        return "{" + ", ".join(sorted(f"{fingerprint(k, seen)}: {fingerprint(v, seen)}" for k, v in obj.items())) + "}"
    if isinstance(obj, SimpleNamespace):
        return "namespace" + fingerprint(vars(obj), seen)
    py_func = getattr(obj, "py_func", None) or getattr(obj, "_defn", None)  # a dispatcher, an intrinsic
    if py_func is not None:
        obj = py_func
    if callable(obj) and hasattr(obj, "__code__"):
        if id(obj) in seen:
            return obj.__qualname__
        seen.add(id(obj))
        cells = [fingerprint(c.cell_contents, seen) for c in (obj.__closure__ or ()) if _filled(c)]
        defaults = [fingerprint(d, seen) for d in (obj.__defaults__ or ())]
        return f"{obj.__module__}.{obj.__qualname__}{_outside(obj, seen)}({', '.join(cells)}; {', '.join(defaults)})"
    if isinstance(obj, np.ndarray):  # by its bytes: a large array's repr leaves most of them out
        digest = hashlib.sha256(np.ascontiguousarray(obj).view(np.uint8).reshape(-1)).hexdigest()[:32]
        return f"array({obj.dtype.str}, {obj.shape}, {digest})"
    text = repr(obj)
    if " at 0x" in text:  # a repr that names an address: different in every process
        return type(obj).__qualname__ + fingerprint(getattr(obj, "__dict__", {}), seen)
    return text


def _outside(fn, seen) -> str:
    """For a function from outside the package (a user's score_mod or mask_mod, compiled into a kernel), what the
    source hash does not cover: its code (an edited lambda keeps its name) and the globals it reads, as
    ``[code digest; name=value, ...]``; nothing for the package's own."""
    if (fn.__module__ or "").split(".")[0] == PACKAGE.name:
        return ""
    from .user_code import global_names

    read = [f"{n}={fingerprint(fn.__globals__[n], seen)}" for n in sorted(global_names(fn.__code__))
            if n in fn.__globals__]
    return f"[{hashlib.sha256(marshal.dumps(fn.__code__)).hexdigest()[:32]}; {', '.join(read)}]"


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # a cell not yet bound
        return False
    return True


@lru_cache(maxsize=None)
def versions() -> dict:
    """The versions a cubin depends on beyond the package: numba-cuda, numba and the CUDA driver (once per process)."""
    from importlib.metadata import version

    from cuda.bindings import driver

    _, driver_version = driver.cuDriverGetVersion()
    return {"numba_cuda": version("numba-cuda"), "numba": version("numba"), "driver": int(driver_version)}


def kernel_key(dispatcher, signature, cc) -> tuple[str, dict]:
    """(the key, its parts) of ``dispatcher`` compiled for ``signature`` on a device of capability ``cc``."""
    parts = {"source": source_hash(), "kernel": fingerprint(dispatcher), "signature": repr(tuple(signature)),
             "options": fingerprint(dict(dispatcher.targetoptions)), "cc": list(cc), **versions()}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32], parts


def cubin_bytes(cubin) -> bytes:
    """The bytes of what numba's ``get_cubin`` returns: bytes, or (numba-cuda 0.30 with cuda.core) an ``ObjectCode``
    whose ``code`` is the bytes or a file's path."""
    code = getattr(cubin, "code", cubin)
    if isinstance(code, (bytes, bytearray, memoryview)):
        return bytes(code)
    return Path(code).read_bytes()


def load(key: str):
    """(cubin bytes, entry name) of a kept kernel, or None."""
    folder = cache_dir()
    if folder is None:
        return None
    try:
        meta = json.loads((folder / f"{key}.json").read_text())
        cubin = (folder / f"{key}.cubin").read_bytes()
    except (OSError, ValueError):
        return None
    return cubin, meta["entry"]


def store(key: str, cubin: bytes, entry: str, parts: dict) -> None:
    """Keep a compiled kernel: the cubin first, then the JSON that makes it found."""
    folder = cache_dir()
    if folder is None:
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for suffix, data in ((".cubin", cubin), (".json", json.dumps({"entry": entry, **parts}).encode())):
            with tempfile.NamedTemporaryFile(dir=folder, delete=False, suffix=".tmp") as f:
                f.write(data)
            os.replace(f.name, folder / f"{key}{suffix}")
    except OSError:  # a read-only or full disk: the kernel still runs, compiled
        pass
