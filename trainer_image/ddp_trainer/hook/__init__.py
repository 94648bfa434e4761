"""The no-code sync hook: the process-wide entry (bootstrap/sitecustomize.py, standard library only) and the
hook that drives a SyncHealth in a user's script (autoinstrument). The init container that installs it is
python -m ddp_trainer.inject, kept at the top as the command every trainer image answers to."""
