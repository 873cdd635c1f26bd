"""Token sequences generated on the fly: ListOps (`listops`), LRA's image as pixels (`lra_image`), Pathfinder
(`pathfinder`, its generator in `_pathfinder_generator`), and the recall probes (`recall`).
"""
