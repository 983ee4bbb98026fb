"""What attention costs in bytes: the lessons' and figures' models, each checked against a measurement.

    memory.py    bytes of each array of one attention call (S, P, Q, K, V, O, lse), the largest N whose
                 N × N matrices fit a budget, and peaks measured with tracemalloc
    traffic.py   bytes moved to and from HBM: standard attention against FlashAttention, counted from the
                 blocked stage's own tile loads, in closed form, and the paper's bounds

This package imports the rules (``tinyflash.core``), stage 1 (whose tile loads it counts) and the GPU's
facts (``tinyflash.hardware``); nothing of the GPU runtime.
"""
