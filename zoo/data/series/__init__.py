"""Time series: classification from .ts and CSV files and sktime's UCR sets (`classification`), long-horizon
forecasting windows and their baselines (`forecast`).
"""
