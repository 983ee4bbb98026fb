import sys, traceback
import numpy as np, cupy
from tinyflash.measure import bench_decode as bd
from tinyflash.measure.harness import time_call
rng = np.random.default_rng(1)
for batch in (1, 8):
    gen = cupy.random.default_rng(5)
    q, k, v = bd.inputs(batch, 4096, gen)
    found = bd.candidates(q, k, v, rng)
    for impl, variant, splits, fn, output in found:
        try:
            fn(); cupy.cuda.Device().synchronize()
            t = time_call(fn)["time_ms"]
            print(f"B={batch} {impl} {variant}: ok {t*1e3:.1f} us", flush=True)
        except Exception as e:
            print(f"B={batch} {impl} {variant}: FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
            traceback.print_exc(limit=8)
            sys.exit(1)
