"""``ddpjob local``: the very same DDPJob on this machine, with no cluster.

- ``processes``: pure; the rendered Job's pods as local processes (command line, environment, folders).
- ``host``: this machine: free ports, visible GPUs, the run folder.
- ``gang``: the pods' process groups: start together, stop together, leave nothing behind.
- ``run``: the edge: start each attempt, watch it, ask ``decide.restarts`` what next, print progress and a
  summary.
- ``elastic``: an elastic job's store in a process of its own, a lost pod replaced; ``scripts``: the
  scripts a spec names by a relative path, found here.

The gang semantics are the operator's: one pod fails, the attempt fails, and ``restarts.decide`` chooses
between a gang restart (resuming from the checkpoint) and giving up.
"""
