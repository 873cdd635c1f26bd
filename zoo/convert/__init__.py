"""Converting a trained softmax ViT to an efficient attention: the attention transfer itself (`model`), and a
run folder or checkpoint in, a converted, evaluated run out (`run`).
"""
