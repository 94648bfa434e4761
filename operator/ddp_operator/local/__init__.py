"""``ddpjob local``: the very same DDPJob on this machine, with no cluster.

- ``processes``: pure; the rendered Job's pods as local processes (command line, environment, folders).
- ``host``: this machine: free ports, visible GPUs, the run folder.
- ``gang``: the pods' process groups: start together, stop together, leave nothing behind.
- ``run``: the edge: start each attempt, watch it, ask ``policy`` what next, print progress and a summary.

The gang semantics are the operator's: one pod fails, the attempt fails, and ``policy.decide`` chooses
between a gang restart (resuming from the checkpoint) and giving up.
"""
