"""Training: the accelerate loop (`loop`), distributed strategies and replica checks (`distributed`),
masked-token self-pretraining (`self_pretrain`).
"""
