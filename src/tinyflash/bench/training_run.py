"""Two training runs of one model compared: tinyflash's attention against SDPA's (``examples/train_gpt.py``).

The example writes one row per (implementation, step) to ``figures/data/gpt_training_<device>.csv``;
:func:`compare` reads the two curves back and says how far apart they are and how fast each trained. A
third run, SDPA again from the same seed (:data:`REPEAT`), says how far SDPA's curve is from itself: its
backward adds dQ with atomics, so two runs round differently, and training carries the difference on.
Where the loss falls steeply (about 0.01 nats a step, around step 150-200 of the example), a run that
falls a few steps earlier than another is 0.05-0.1 nats away from it there, and two SDPA runs from one
seed were measured that far apart. So the allowed gap is TOLERANCE, or twice SDPA's own gap in the same
run when that is larger (:data:`SELF_FACTOR`, FlashAttention's 2× rule applied to the curves): the curve
of tinyflash may part from SDPA's by no more than twice what rounding alone does to SDPA. The example,
the figure (``python -m tinyflash.plots --only gpt_training``), the docs' numbers and the tests use this
one reading.
"""

from __future__ import annotations

import numpy as np

SMOOTH = 20  # steps in the moving average of the training loss
TOLERANCE = 0.05  # nats: the largest allowed gap between the two smoothed curves, and between held-out losses
SELF_FACTOR = 2.0  # ... or this many times SDPA's gap to its own second run, when that is larger
IMPLS = ("tinyflash", "sdpa_flash")
REPEAT = "sdpa_flash_repeat"  # SDPA trained a second time from the same seed: how far SDPA is from itself
WARMUP = 10  # first steps of each run left out of its speed (compilation, allocator growth)


def smoothed(losses, window: int = SMOOTH) -> np.ndarray:
    """The moving average over the last ``window`` steps (fewer at the start)."""
    losses = np.asarray(losses, dtype=float)
    sums = np.concatenate([[0.0], np.cumsum(losses)])
    idx = np.arange(1, len(losses) + 1)
    first = np.maximum(idx - window, 0)
    return (sums[idx] - sums[first]) / (idx - first)


def curves(rows: list[dict]) -> dict:
    """impl -> (steps, training losses, steps of held-out losses, held-out losses, step times in ms), from rows
    as the example writes them (numbers or the strings of a CSV read back)."""
    out = {}
    for impl in IMPLS + ((REPEAT,) if any(r["impl"] == REPEAT for r in rows) else ()):
        mine = sorted((r for r in rows if r["impl"] == impl), key=lambda r: int(r["step"]))
        held = [r for r in mine if r.get("eval_loss") not in (None, "")]
        out[impl] = (np.array([int(r["step"]) for r in mine]), np.array([float(r["loss"]) for r in mine]),
                     np.array([int(r["step"]) for r in held]), np.array([float(r["eval_loss"]) for r in held]),
                     np.array([float(r["step_ms"]) for r in mine]))
    return out


def compare(rows: list[dict], tokens_per_step: int | None = None) -> dict:
    """The largest gaps between the two runs (smoothed training loss, held-out loss), each run's final smoothed
    loss, and, with ``tokens_per_step``, each run's tokens per second after WARMUP steps. Raises if the runs'
    steps differ."""
    c = curves(rows)
    (steps_a, loss_a, held_a, eval_a, _), (steps_b, loss_b, held_b, eval_b, _) = (c[i] for i in IMPLS)
    if len(steps_a) == 0 or not (np.array_equal(steps_a, steps_b) and np.array_equal(held_a, held_b)):
        raise ValueError(f"the two runs must have the same steps; got {len(steps_a)} and {len(steps_b)}")
    result = {"steps": len(steps_a),
              "max_train_gap": float(np.abs(smoothed(loss_a) - smoothed(loss_b)).max()),
              "max_eval_gap": float(np.abs(eval_a - eval_b).max()) if len(eval_a) else float("nan"),
              "final_loss": {i: float(smoothed(c[i][1])[-1]) for i in c},
              "final_eval": {i: float(c[i][3][-1]) if len(c[i][3]) else float("nan") for i in IMPLS}}
    result["worst_step"] = int(steps_a[np.abs(smoothed(loss_a) - smoothed(loss_b)).argmax()])
    result["allowed_train_gap"] = result["allowed_eval_gap"] = TOLERANCE
    if REPEAT in c:  # SDPA against itself: the spread that rounding alone (its atomics) leaves between two runs
        result["sdpa_self_train_gap"] = float(np.abs(smoothed(c[REPEAT][1]) - smoothed(loss_b)).max())
        result["sdpa_self_eval_gap"] = float(np.abs(c[REPEAT][3] - eval_b).max()) if len(eval_b) else float("nan")
        result["allowed_train_gap"] = max(TOLERANCE, SELF_FACTOR * result["sdpa_self_train_gap"])
        result["allowed_eval_gap"] = max(TOLERANCE, SELF_FACTOR * result["sdpa_self_eval_gap"])
    result["within"] = (result["max_train_gap"] <= result["allowed_train_gap"]
                        and result["max_eval_gap"] <= result["allowed_eval_gap"])
    if tokens_per_step:
        result["tokens_per_s"] = {i: tokens_per_step * len(c[i][4][WARMUP:]) / (c[i][4][WARMUP:].sum() / 1e3)
                                  for i in c}
    return result


def sentence(rows: list[dict]) -> str:
    """What docs/results.md says of the example's run: the gaps, SDPA's own, the final losses, the speeds."""
    r0 = rows[0]
    c = compare(rows, int(r0["batch"]) * int(r0["context"]))
    speed = c["tokens_per_s"]
    again = (f" SDPA against its own second run from the same seed (its backward adds dQ with atomics too) parts by "
             f"up to {c['sdpa_self_train_gap']:.3f} and {c['sdpa_self_eval_gap']:.3f}." if REPEAT in speed else "")
    return (f"A character-level GPT ({r0['layers']} layers, width {r0['width']}, {r0['heads']} heads of "
            f"{int(r0['width']) // int(r0['heads'])}, context {r0['context']}, {r0['dtype']}) trained for {c['steps']} "
            f"steps from one seed with `tinyflash.torch.attention` and with SDPA's flash backend "
            f"(`examples/train_gpt.py`): the two training-loss curves, each averaged over {SMOOTH} steps, part by at "
            f"most {c['max_train_gap']:.3f} (at step {c['worst_step']}) and the held-out "
            f"losses by at most {c['max_eval_gap']:.3f}.{again} The allowed gaps, {TOLERANCE} nats or twice SDPA's "
            f"own where that is larger ({c['allowed_train_gap']:.3f} and {c['allowed_eval_gap']:.3f}), are "
            f"{'met' if c['within'] else 'not met'}. Final losses: {c['final_loss']['tinyflash']:.4f} and "
            f"{c['final_loss']['sdpa_flash']:.4f}. Tokens per second in the same interleaved run: "
            f"{speed['tinyflash']:,.0f} and {speed['sdpa_flash']:,.0f} "
            f"({speed['tinyflash'] / speed['sdpa_flash']:.2f}×; measured {r0['date'][:10]}).")
