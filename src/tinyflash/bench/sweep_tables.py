"""The tiling sweep of stage 3's kernel v6 (``tensor-core-tiles``) as the docs show it: each tiling's speed per
(N, d, causal), and, with the causal mask, the speed for each number of heads ordered together beside the number
v6's rule takes (its tiling's ``head_group``)."""

from __future__ import annotations

from .cells import DASH, ok_rows


def tiling_of(variant: str) -> dict:
    """'v6 warps=8 row_tiles=2 ... group=4 kernel=grouped' -> {'warps': '8', ...}."""
    return dict(part.split("=", 1) for part in variant.split() if "=" in part)


def tiling_points(rows: list[dict]) -> dict:
    """v6's tiling sweep (``tensor-core-tiles``): (N, d, causal) -> {(warps, row tiles, Q in smem, keys, lazy,
    kernel): {head group: (TFLOP/s, speed over flash)}}."""
    out = {}
    for r in ok_rows(rows, impl="tinyflash"):
        t = tiling_of(r["variant"])
        key = (int(t["warps"]), int(t["row_tiles"]), t["q_in_smem"] == "True", int(t["BC"]), t["lazy"] == "True",
               t["kernel"])
        point = (int(r["n_q"]), int(r["d"]), r["causal"] == "True")
        out.setdefault(point, {}).setdefault(key, {})[int(t["group"])] = (float(r["tflops"]), float(r["vs_baseline"]))
    return out


def sweep_of(rows: list[dict], causal: bool) -> dict:
    """The tiling sweep that chose v6's defaults for ``causal``: with the mask, the kernel that orders its blocks
    by groups of heads; without it, the kernel that takes one head at a time (the one that runs there)."""
    kernel = "grouped" if causal else "one-head"
    return {p: {k[:5]: g for k, g in tilings.items() if k[5] == kernel}
            for p, tilings in tiling_points(rows).items() if p[2] == causal}


def tiles_table(rows: list[dict]) -> str:
    """The tiling sweep as a table: each (N, d, causal), each tiling's speed at its fastest head group."""
    points = {**sweep_of(rows, False), **sweep_of(rows, True)}
    columns = sorted({t for tilings in points.values() for t in tilings}, key=lambda t: (-t[0], not t[2], not t[4]))
    head = " | ".join(f"{w} warps, Q in {'smem' if q else 'registers'}, {'lazy' if lazy else 'eager'}"
                      for w, _, q, _, lazy in columns)
    out = [f"| N | d | causal | {head} |", "|---|---|---|" + "---|" * len(columns)]
    for (n, d, causal), tilings in sorted(points.items(), key=lambda kv: (kv[0][0], -kv[0][1], kv[0][2])):
        best = {c: max(tilings[c].items(), key=lambda kv: kv[1][0]) for c in columns if c in tilings}  # fastest group
        cells = [f"{best[c][1][0]:.1f} ({best[c][1][1]:.2f}×, {best[c][0]})" if c in best else DASH for c in columns]
        out.append(f"| {n:,} | {d} | {causal} | {' | '.join(cells)} |")
    return "\n".join(out)


def groups_table(rows: list[dict]) -> str:
    """Causal: the default tiling's speed (TFLOP/s and over flash) for each number of heads ordered together,
    and the number v6's rule takes (``head_group``)."""
    from ..forward.kernels import tensor_core_tiling as tiling

    points = sweep_of(rows, True)
    groups = sorted({g for tilings in points.values() for t in tilings.values() for g in t})
    out = [f"| N | d | {' | '.join(f'{g} head' + ('s' if g > 1 else '') for g in groups)} | head_group |",
           "|---|---|" + "---|" * (len(groups) + 1)]
    for (n, d, _), tilings in sorted(points.items(), key=lambda kv: (kv[0][0], -kv[0][1])):
        cfg = tiling.default_tiling(d, True, n)
        timed = tilings[tiling_key(cfg)]
        cells = [f"{timed[g][0]:.1f} ({timed[g][1]:.2f}×)" if g in timed else DASH for g in groups]
        out.append(f"| {n:,} | {d} | {' | '.join(cells)} | {cfg.head_group(n, 32, 1, True)} |")
    return "\n".join(out)


def tiling_key(cfg) -> tuple:
    """A tiling as the sweep keys it: (warps, row tiles, Q in smem, keys, lazy)."""
    return cfg.WARPS, cfg.ROW_TILES, cfg.Q_IN_SMEM, cfg.BC, cfg.LAZY_RESCALE
