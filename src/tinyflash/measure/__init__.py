"""Tooling, not teaching code: models, measurements and figures.

    memory.py, traffic.py      memory and HBM-traffic models, and counting them
    harness.py                 the one benchmark harness: check, time, one CSV schema
    bench.py, report.py        the GPU benchmarks (python -m tinyflash.bench) and their tables
    plots.py, plot_*.py        the README's figures (python -m tinyflash.plots)
"""
