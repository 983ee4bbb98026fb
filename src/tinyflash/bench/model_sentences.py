"""The docs' sentences computed from the cost models (``tinyflash.cost``, ``hardware``) and the CPU's memory
records: what fits where, the traffic to HBM, the memory a training step keeps, the size of a KV cache. The
figures' captions in docs/results.md quote them (``bench.docs.BLOCKS`` names each block)."""

from __future__ import annotations

from .record import data_dir, read_csv


def memory_fit() -> str:
    from ..cost.memory import attention_memory, format_bytes, max_sequence_length
    from ..hardware import CONSUMER_CARD_BYTES, H200

    m = attention_memory(32_768, 128, heads=32, dtype="float16")
    return (f"For 32 heads, S and P in float16 fit in 24 GiB only up to N = "
            f"{max_sequence_length(CONSUMER_CARD_BYTES, heads=32):,} and in the H200's "
            f"{H200.memory_bytes / 1e9:.0f} GB up to N = {max_sequence_length(H200.memory_bytes, heads=32):,}: at "
            f"N = 32,768 the scores alone take {format_bytes(m.scores)}, S and P {format_bytes(m.logits_and_probabilities)}, "
            f"where FlashAttention keeps O and lse, {format_bytes(m.o + m.lse)}.")


def traffic() -> str:
    from ..cost.traffic import HOPPER_SRAM_ELEMENTS, SRAM_ELEMENTS, tile_sizes, traffic_crossover, traffic_ratio
    from ..plots.traffic import TRAFFIC_M_N

    cross = traffic_crossover(TRAFFIC_M_N, 64)
    br, bc = tile_sizes(cross, 64)
    return (f"At N = 131,072 standard attention moves {traffic_ratio(131_072, 64, SRAM_ELEMENTS):.1f}× the bytes of "
            f"FlashAttention with 64 × 64 tiles (M = {SRAM_ELEMENTS:,}) and {traffic_ratio(131_072, 64, HOPPER_SRAM_ELEMENTS):.1f}× "
            f"with an H200 multiprocessor's shared memory (M = {HOPPER_SRAM_ELEMENTS:,}). At N = {TRAFFIC_M_N:,}, below "
            f"M = {cross:,} elements (tiles smaller than {br} × {bc}) FlashAttention would move more bytes than "
            "standard attention.")


def cpu_memory() -> str:
    from ..cost.memory import blocked_workspace_bytes, format_bytes
    from ..plots.memory import CPU_BLOCK

    rows = [r for r in read_csv(data_dir() / "memory_cpu_measured.csv") if r["stage"] == "blocked"]
    off = [int(r["measured_peak_bytes"]) / int(r["model_bytes"]) - 1 for r in rows]
    return (f"The blocked stage runs here with Br = Bc = {CPU_BLOCK}: the temporaries of its loop then peak at "
            f"{format_bytes(blocked_workspace_bytes(CPU_BLOCK, CPU_BLOCK, 64))} (the model of "
            "``cost.memory.blocked_workspace_bytes``: three score tiles and an accumulator while the next tile's "
            f"scores are made), the same at every N; measured, it lies within {100 * max(map(abs, off)):.1f} % of "
            "that model plus O and lse, at every N.")


def training_memory() -> str:
    rows = {(r["stage"], int(r["n"])): r for r in read_csv(data_dir() / "training_memory.csv")}
    naive, flash, flash_16k = rows["naive", 4096], rows["flash", 4096], rows["flash", 16384]

    def mib(r, key):
        return f"{int(r[key]) / 2**20:.{1 if int(r[key]) > 10 * 2**20 else 2}f} MiB"

    return (f"At N = 4,096 the naive stage kept {mib(naive, 'kept_bytes')} for the backward (S, P and O) and its "
            f"backward peaked at {mib(naive, 'backward_peak_bytes')}; FlashAttention kept {mib(flash, 'kept_bytes')} "
            f"(O and lse) and its backward peaked at {mib(flash, 'backward_peak_bytes')}, and at "
            f"{mib(flash_16k, 'backward_peak_bytes')} at N = 16,384.")


def kv_cache() -> str:
    from ..cost.memory import format_bytes
    from ..decode.cache_memory import kv_cache_bytes
    from ..hardware import H200

    size = {h: kv_cache_bytes(layers=32, kv_heads=h, head_dim=128, context=131_072) for h in (32, 8, 1)}
    return (f"At 131,072 tokens, 32 layers, d = 128: {format_bytes(size[32])} with multi-head attention, "
            f"{format_bytes(size[8])} with 8 K/V heads, {format_bytes(size[1])} with one, half of each in int8; the "
            f"H200's {H200.memory_bytes / 1e9:.0f} GB hold the multi-head cache of {H200.memory_bytes // size[32]} "
            "such sequences.")
