"""The record: one CSV schema for every benchmark, with the device, the versions and the date in each row.

A benchmark writes its rows to ``figures/data/<name>_<device>.csv`` as it measures them (a run cut
short keeps what it measured). Tables, figures, the docs and the tests read those files back with
:func:`read_csv`; nothing reads a log.

The columns (:data:`FIELDS`), empty where they do not apply:

* where and when: ``device``, ``date``, the versions of ``numpy``, ``numba_cuda``, ``cupy``, ``torch``,
  and the git ``commit`` of the code that ran;
* what: ``benchmark``, ``impl`` (tinyflash, torch_flash, naive, ...), ``variant`` (a kernel version, a
  tiling, a backend's setting), ``dtype``, ``causal``, ``batch``, ``heads``, ``kv_heads``, ``n_q``,
  ``n_k``, ``d``;
* the check, made before anything is timed: ``status`` (:data:`STATUSES`), ``max_rel_err``, ``tolerance``;
* the time (``timing`` says how it was taken: :data:`TIMINGS`): ``time_ms`` with the fastest and slowest
  round, ``latency_ms`` (one call alone), ``rounds``, ``burst``; the rate, ``tflops`` or ``tb_per_s``;
  ``peak_bytes`` beyond the inputs, ``inputs_bytes``;
* against the run's ``baseline`` peer (its time over this one's: above 1 is faster): ``vs_baseline``,
  the quartiles of the rounds' ratios ``vs_baseline_q1``, ``vs_baseline_q3``, and ``latency_vs_baseline``;
* the kernel: ``num_splits`` (decoding), ``regs``, ``local_bytes`` (spilled), ``smem_bytes``.
"""

from __future__ import annotations

import csv
import datetime
import os
import subprocess
from pathlib import Path

import numpy as np

FIELDS = ["device", "date", "numpy", "numba_cuda", "cupy", "torch", "commit",
          "benchmark", "impl", "variant", "dtype", "causal", "batch", "heads", "kv_heads", "n_q", "n_k", "d",
          "status", "max_rel_err", "tolerance",
          "timing", "time_ms", "time_min_ms", "time_max_ms", "latency_ms", "rounds", "burst", "tflops", "tb_per_s",
          "peak_bytes", "inputs_bytes",
          "baseline", "vs_baseline", "vs_baseline_q1", "vs_baseline_q3", "latency_vs_baseline",
          "num_splits", "regs", "local_bytes", "smem_bytes"]
# 'wrong' rows say by how much: "wrong (error ... > ...)"; 'unsupported': the implementation refuses the inputs
STATUSES = ("ok", "oom", "unsupported", "wrong")
TIMINGS = {
    "interleaved": "peers in turn, round by round, each settled first: time_ms of calls queued back to back "
                   "(GPU time per call), latency_ms of one call alone (host included)",
    "single calls": "each peer's calls together, one at a time between CUDA events, the GPU idle before each: "
                    "time_ms is one call alone (the method of the earlier runs)",
}


def repository() -> Path:
    """The checkout this package runs from (src/tinyflash/bench/ is three levels below it)."""
    return Path(__file__).resolve().parents[3]


def data_dir() -> Path:
    """Where the record lives: figures/data/ of the checkout."""
    return repository() / "figures" / "data"


def git_commit() -> str:
    """The short hash of the checkout's HEAD ('' outside a git checkout), with '+' if files differ from it; or
    TINYFLASH_COMMIT, where it is set: for a copy of a working tree whose .git is not the one it came from."""
    if os.environ.get("TINYFLASH_COMMIT"):
        return os.environ["TINYFLASH_COMMIT"]
    try:
        run = lambda *args: subprocess.run(["git", *args], cwd=repository(), capture_output=True,  # noqa: E731
                                           text=True, timeout=10)
        head = run("rev-parse", "--short", "HEAD").stdout.strip()
        dirty = run("status", "--porcelain", "--untracked-files=no").stdout.strip()
        return head + ("+" if head and dirty else "")
    except (OSError, subprocess.SubprocessError):
        return ""


def versions() -> dict:
    """The library versions of a row (empty where a library is not installed)."""
    from importlib import import_module
    from importlib.metadata import PackageNotFoundError, version

    found = {"numpy": np.__version__}
    try:
        found["numba_cuda"] = version("numba-cuda")
    except PackageNotFoundError:
        found["numba_cuda"] = ""
    for name in ("cupy", "torch"):  # their distributions have several names (cupy-cuda13x, ...): ask the module
        try:
            found[name] = import_module(name).__version__
        except ImportError:
            found[name] = ""
    return found


def environment(device: str | None = None) -> dict:
    """Device, date, versions and commit, written into every row. ``device``: the GPU's name if None."""
    if device is None:
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
        device = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return {"device": device, "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            **versions(), "commit": git_commit()}


class CsvWriter:
    """Rows of :data:`FIELDS` (or of ``fields``), written and flushed one by one; floats with 6 significant
    digits, missing fields empty. An existing file with other columns is not overwritten: a CSV of the
    record is only ever replaced by a run of the same schema."""

    def __init__(self, path, fields=FIELDS):
        self.fields = list(fields)
        self.file = self.writer = None
        if path:
            path = Path(path)
            if path.exists() and path.stat().st_size:
                with open(path, newline="") as f:
                    header = next(csv.reader(f), [])
                if header != self.fields:
                    raise ValueError(f"{path} holds a CSV with other columns ({', '.join(header[:6])}, ...); "
                                     "write this run's rows to another file")
            path.parent.mkdir(parents=True, exist_ok=True)
            self.file = open(path, "w", newline="")
            self.writer = csv.DictWriter(self.file, fieldnames=self.fields)
            self.writer.writeheader()

    def write(self, row: dict) -> None:
        unknown = set(row) - set(self.fields)
        if unknown:
            raise ValueError(f"row has fields outside the schema: {sorted(unknown)}")
        if self.writer:
            self.writer.writerow({f: f"{row[f]:.6g}" if isinstance(row.get(f), float) else row.get(f, "")
                                  for f in self.fields})
            self.file.flush()

    def close(self) -> None:
        if self.file:
            self.file.close()


def read_csv(path) -> list[dict]:
    """The rows of a CSV as dicts of strings."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def number(row: dict, field: str, default=None):
    """A numeric field of a row read back, or ``default`` where it is empty."""
    value = row.get(field)
    return default if value in (None, "") else float(value)
