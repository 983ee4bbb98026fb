"""Tooling, not teaching code: the benchmarks. ``python -m tinyflash.bench NAME`` runs one.

    record.py    the one CSV schema of the record (figures/data/*.csv), the environment of every row
    timing.py    peers timed together in interleaved rounds, settled, queued and alone
    checking.py  the one check of a result (any array library), and the naive computation in the same precision
    peers.py     what is timed: tinyflash's stages, PyTorch SDPA's backends, naive attention, a copy
    suites.py    the benchmarks, declared as data: axes, values, peers
    runner.py    the one runner: inputs, check, time, one row each
    tables.py    the tables and sentences of the docs, from the record
    __main__.py  the command

Nothing in the teaching code imports this package.
"""
