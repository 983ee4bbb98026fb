"""Tooling, not teaching code: the benchmarks. ``python -m tinyflash.bench NAME`` runs one.

    record.py    the one CSV schema of the record (figures/data/*.csv), the environment of every row
    timing.py    peers timed together in interleaved rounds, settled, queued and alone
    checking.py  the one check of a result (any array library), and the naive computation in the same precision
    peers.py     what is timed: tinyflash's stages, PyTorch SDPA's backends, naive attention, a copy
    suites.py    the benchmarks, declared as data: axes, values, peers
    runner.py    the one runner: inputs, check, time, one row each
    training_run.py  two training runs of one model compared (examples/train_gpt.py's record)
    fp8_accuracy.py  FP8's error on the CPU: bfloat16 and FP8 per tensor, per block, rotated, against float64
    cells.py     what every table is made of: rows found by their fields, cells, speed ratios
    tables.py    the tables and sentences of the docs, from the record; sweep_tables.py: v6's tiling sweep
    docs.py      the generated blocks of README.md and docs/*.md (model_sentences.py: the cost models' sentences;
                 lesson_times.py: each lesson's running time, in its docstring)
    __main__.py  the command

Nothing in the teaching code imports this package.
"""
