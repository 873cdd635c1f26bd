"""The library of zoo's benchmark and study commands, kept out of the importable `zoo` package (`import zoo` never
loads it). The commands are at the top of tools/ (`benchmark.py`, `leaderboard.py`, `recall.py`, `device_check.py`,
`pages.py`), which find this package beside them; tests put `tools/` on `sys.path`. Nothing is imported here, so each
module costs only what it uses. Imports go down this list (tests/test_layers.py holds them to no cycle).

Measuring:
- `machine`: the device's name, its results folder, package versions, and paths as a committed report shows them.
- `peers`: the peer packages' layers (performer-pytorch, linformer, ...) behind zoo's forward signature.
- `measure`: one configuration in this process (time, peak memory, error against exact attention); run as
  `python -m zoo_bench.measure --single JSON` it is the fresh child process of a sweep.
- `report`, `sweep`: every (variant, length) in a fresh subprocess, its slope and crossover fits, `results.md` and
  the plots.
- `device_*`: the GPU check (`tools/device_check.py`) and `device_train`.

Studies, each a grid of cells on one skeleton (`_study`: run, resume from the JSON, rewrite the report per cell):
- `leaderboard`, `leaderboard_report`: every variant trained on one task recipe under one step budget.
- `recall_grid`, `recall_speed`, `recall_report`, `recall`: MQAR over variants, lengths, widths, seeds and lrs.
- `highres`, `seg_bench`, `conversion`: the image layouts at high resolution, segmentation, and a softmax teacher
  converted to each variant (`make bench-highres`, `make bench-seg`, `make bench-conversion`).

Pages, from the committed results (`tools/pages.py`): `_results` (loading, the noise margin, the one format of each
number), `cards`, `choose`, `results_pages`, and `pages`, which writes them all.
"""
