"""What the operator sees: a DDPJob's Jobs and pods turned into facts (facts), a failed rank's first error
(podlogs, failures), the checkpoint claim (claims), Kueue's word on a queued job (kueue), a running job's
metrics (live, progress), and all of one reconcile's readings as the decision's one input (observation).
Pure; never decides."""
