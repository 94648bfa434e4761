"""ddp_trainer: a seeded, broadcast-verified PyTorch DDP trainer, and the sync library it uses.

``python -m ddp_trainer --help`` lists the arguments; :mod:`ddp_trainer.sync` is the public library.
"""
