"""Models in and out of runs and files: a run folder or checkpoint to verified weights (`_run_weights`),
checkpoint manifests and verified resume (`checkpoints`), a run directory's model.json (`runs`), and loading,
saving and pushing models (`load`).
"""
