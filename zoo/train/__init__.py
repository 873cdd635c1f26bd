"""Training: the accelerate loop (`loop`: the Trainer, checkpoint save and restore, the non-finite checks), its
evaluation pass (`eval_loop`) and what a run reports as it goes (`_tracking`: progress bar, trackers, metrics.jsonl),
distributed strategies and replica checks (`distributed`), masked-token self-pretraining (`self_pretrain`).
"""
