"""Development tools for the fused kernels: tuning and profiling, not part of what a user runs.

Run as `PYTHONPATH=tools python -m dev.<tool>` from the repository root, as README.md in this folder says. Nothing is
imported here, so each module costs only what it uses.
"""
