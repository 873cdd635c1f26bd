"""Training: a recipe's run as stages (`stages`: self-pretraining, then the Trainer; `train` is tools/train.py's
entry), what a run is built from (`parts`), the accelerate loop (`loop`: the Trainer, checkpoint save and restore, the
non-finite checks), its evaluation pass (`eval_loop`) and what a run reports as it goes (`_tracking`: progress bar,
trackers, metrics.jsonl), distributed strategies and replica checks (`distributed`), masked-token self-pretraining's
objective (`self_pretrain`). A recipe's splits and loaders come from `zoo.splits`.
"""
