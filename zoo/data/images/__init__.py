"""Image data: users' ImageFolder trees (`folder`), MegaMNIST canvases of real digits (`megamnist`), and how
any image file is decoded, the same for training and prediction (`decode`).
"""
