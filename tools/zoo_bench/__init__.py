"""Benchmarks of zoo's attention variants, kept out of the importable `zoo` package (`import zoo` never loads it).

- `measure`: one configuration in this process (time, peak memory, error against exact attention); run as
  `python -m zoo_bench.measure --single JSON` it is the fresh child process of a sweep.
- `peers`: the peer packages' layers (performer-pytorch, linformer, ...) behind zoo's forward signature.
- `sweep`: every (variant, length) in a fresh subprocess, failures recorded, `--merge` of an earlier sweep.
- `report`: slope and crossover fits, `results.md`, `time.png` and `memory.png`.
- `machine`: the device's name, its results folder, the package versions of a measurement, and paths as a
  committed report shows them (`shown_path`).
- `leaderboard`, `leaderboard_report`: every variant trained on one task recipe under one step budget.
- `conversion`: a softmax teacher converted to each variant at 4x the tokens (`make bench-conversion`).
- `highres`: one ViT recipe trained with each 2-D / global layout, and a step of each at 16K tokens
  (`make bench-highres`).

The command lines are `tools/benchmark.py` and `tools/leaderboard.py`, which find this package beside them; tests
put `tools/` on `sys.path`. Nothing is imported here, so each module costs only what it uses.
"""
