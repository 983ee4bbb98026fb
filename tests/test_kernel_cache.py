"""The disk cache of compiled kernels (``tinyflash.gpu.kernel_cache``): its key names everything a kernel is
built from, the same in every process; an edit anywhere in the package changes it; files in and out. On a GPU:
a second process loads what the first compiled, and an edited copy of the package compiles again."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tinyflash.gpu import kernel_cache

ROOT = Path(__file__).resolve().parents[1]

FINGERPRINT = """
    from tinyflash.backward.kernels import v2_tensor_cores as v2
    from tinyflash.backward.kernels.tensor_core_tiling import default_tiling
    from tinyflash.forward.kernels import v6_tensor_cores as v6
    from tinyflash.forward.kernels.tensor_core_tiling import default_tiling as v6_tiling
    from tinyflash.gpu import kernel_cache as kc
    kernels = [v2.make_kernel(default_tiling(128), "bfloat16"), v6.build(v6_tiling(64, True, 4096), "float16", 2)]
    print(kc.source_hash())
    for k in kernels:
        print(kc.fingerprint(k), kc.fingerprint(dict(k.targetoptions)))
"""


def run_python(code: str, env: dict | None = None, pythonpath: Path = ROOT / "src") -> str:
    path = os.pathsep.join(p for p in (str(pythonpath), os.environ.get("PYTHONPATH", "")) if p)  # keep the rest
    env = {**os.environ, "PYTHONPATH": path, **(env or {})}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_key_is_the_same_in_every_process():
    """Two processes with different string hashing (the order of a set's items changes with it) fingerprint the
    same kernels the same: no address, no set order in the text."""
    real = {"NUMBA_ENABLE_CUDASIM": "0"}  # numba's real dispatchers (made without a GPU: nothing is compiled)
    first = run_python(FINGERPRINT, {"PYTHONHASHSEED": "1", **real})
    second = run_python(FINGERPRINT, {"PYTHONHASHSEED": "2", **real})
    assert first == second and " at 0x" not in first


def test_the_fingerprint_names_what_the_kernel_is_built_from():
    """Element type, deterministic mode and head dim each give another fingerprint; the intrinsics' PTX text is
    in it, reached through the closures of the device functions."""
    out = run_python("""
        from tinyflash.backward.kernels import v2_tensor_cores as v2
        from tinyflash.backward.kernels.tensor_core_tiling import default_tiling
        from tinyflash.gpu import kernel_cache as kc
        for d, element, det in ((64, "float16", False), (64, "bfloat16", False), (64, "float16", True),
                                (128, "float16", False)):
            print(kc.fingerprint(v2.make_kernel(default_tiling(d), element, det)))
    """, {"NUMBA_ENABLE_CUDASIM": "0"}).splitlines()
    assert len(out) == len(set(out)) == 4
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in out[1]


def test_a_users_function_counts_by_its_code_its_globals_and_its_arrays_bytes(monkeypatch):
    """A score_mod compiled into a kernel comes from outside the package, where the source hash does not look: two
    lambdas of one name and other code, one reading another global value, or capturing arrays that differ only
    where their repr leaves them out (the middle of 16,384 ids) fingerprint apart; the same function twice alike."""
    def make(scale, ids):
        return lambda s, b, h, q, k: s * scale + ids[q]

    ids = np.zeros(16384, np.int8)
    other = ids.copy()
    other[8000] = 1
    plus = lambda s, b, h, q, k: s + OFFSET  # noqa: E731
    minus = lambda s, b, h, q, k: s - OFFSET  # noqa: E731
    plus.__qualname__ = minus.__qualname__ = "mod"
    same = kernel_cache.fingerprint(make(2.0, ids)), kernel_cache.fingerprint(make(2.0, ids.copy()))
    assert same[0] == same[1]
    assert kernel_cache.fingerprint(make(2.0, other)) != same[0] != kernel_cache.fingerprint(make(3.0, ids))
    assert kernel_cache.fingerprint(plus) != kernel_cache.fingerprint(minus)
    before = kernel_cache.fingerprint(plus)
    monkeypatch.setitem(globals(), "OFFSET", 2.0)
    assert kernel_cache.fingerprint(plus) != before
    assert "[" not in kernel_cache.fingerprint(kernel_cache.fingerprint)  # the package's own: its source hash


OFFSET = 1.0


def test_an_edit_anywhere_in_the_package_changes_the_source_hash(tmp_path):
    copy = tmp_path / "tinyflash"
    shutil.copytree(ROOT / "src" / "tinyflash", copy, ignore=shutil.ignore_patterns("__pycache__"))
    code = "from tinyflash.gpu import kernel_cache; print(kernel_cache.source_hash())"
    before = run_python(code, pythonpath=tmp_path)
    assert before == run_python(code)  # the copy hashes as the original
    ptx = copy / "gpu" / "ptx.py"
    ptx.write_text(ptx.read_text().replace("cvt.rn.", "cvt.rn. ", 1))  # one space in an intrinsic's PTX
    assert run_python(code, pythonpath=tmp_path) != before


def test_where_the_cache_lives(monkeypatch, tmp_path):
    monkeypatch.setenv(kernel_cache.ENV, "off")
    assert kernel_cache.cache_dir() is None and kernel_cache.load("0" * 32) is None
    kernel_cache.store("0" * 32, b"x", "entry", {})  # off: nothing written, nothing raised
    monkeypatch.setenv(kernel_cache.ENV, str(tmp_path / "k"))
    assert kernel_cache.cache_dir() == tmp_path / "k"
    monkeypatch.delenv(kernel_cache.ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert kernel_cache.cache_dir() == tmp_path / "xdg" / "tinyflash" / "kernels"


def test_files_in_and_out(monkeypatch, tmp_path):
    monkeypatch.setenv(kernel_cache.ENV, str(tmp_path))
    cubin = np.random.default_rng().bytes(1000)
    kernel_cache.store("a" * 32, cubin, "_Z6kernel", {"cc": [9, 0]})
    assert kernel_cache.load("a" * 32) == (cubin, "_Z6kernel")
    assert json.loads((tmp_path / ("a" * 32 + ".json")).read_text())["cc"] == [9, 0]
    assert not list(tmp_path.glob("*.tmp"))
    (tmp_path / ("a" * 32 + ".json")).write_text("{not json")
    assert kernel_cache.load("a" * 32) is None  # a damaged entry is a miss, not an error
    assert kernel_cache.load("b" * 32) is None
    monkeypatch.setenv(kernel_cache.ENV, str(tmp_path / "file"))
    (tmp_path / "file").write_text("")  # the folder cannot be made: the kernel is just not kept
    kernel_cache.store("c" * 32, cubin, "e", {})


FIRST_CALL = """
    import time, torch, tinyflash as tf
    from tinyflash.gpu import kernel_cache
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, 4, 300, 64, device="cuda", generator=gen).half() for _ in range(3))
    o, lse = tf.tensor_core_attention(q, k, v, causal=True)
    print(kernel_cache.stats["hits"], kernel_cache.stats["misses"], float(o.float().sum()))
"""


@pytest.mark.gpu
def test_a_second_process_loads_what_the_first_compiled(tmp_path):
    pytest.importorskip("torch")
    env = {kernel_cache.ENV: str(tmp_path / "cache")}
    hits, misses, total = run_python(FIRST_CALL, env).split()
    assert int(hits) == 0 and int(misses) >= 1 and list((tmp_path / "cache").glob("*.cubin"))
    hits2, misses2, total2 = run_python(FIRST_CALL, env).split()
    assert int(hits2) == int(misses) and int(misses2) == 0 and total2 == total  # loaded, and the same result
    copy = tmp_path / "src" / "tinyflash"  # an edited copy of the package: every kernel compiled again
    shutil.copytree(ROOT / "src" / "tinyflash", copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "gpu" / "ptx.py").write_text((copy / "gpu" / "ptx.py").read_text() + "\n# edited\n")
    hits3, misses3, total3 = run_python(FIRST_CALL, env, pythonpath=tmp_path / "src").split()
    assert int(hits3) == 0 and int(misses3) == int(misses) and total3 == total


def test_cubin_bytes_from_what_numba_returns(tmp_path):
    """numba's get_cubin gives bytes, or an object whose ``code`` is the bytes or a file's path."""
    data = b"\x7fELF cubin"
    (tmp_path / "k.cubin").write_bytes(data)
    assert kernel_cache.cubin_bytes(data) == data
    assert kernel_cache.cubin_bytes(type("ObjectCode", (), {"code": data})()) == data
    assert kernel_cache.cubin_bytes(type("ObjectCode", (), {"code": str(tmp_path / "k.cubin")})()) == data
