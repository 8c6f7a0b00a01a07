"""Noether charges under the optimizers people use: SGD with momentum, Adam, AdamW.

Beyond the paper (issue #18). ``momentum``: the exact map of (C, B, E) for heavy-ball and
Nesterov SGD and its stationary point; ``decompose``: the exact per-step decomposition of
any update; ``hyper``: noise descriptions read from a ``torch.optim`` optimizer; ``adam``:
the stationary condition and random-walk equilibrium of Adam(W).
"""
