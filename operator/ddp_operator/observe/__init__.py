"""What the operator sees: a DDPJob's Jobs and pods turned into facts (facts), a failed rank's first error
(podlogs, failures), the checkpoint claim (claims), Kueue's word on a queued job (kueue), a running job's
metrics (live, progress). Pure; never decides."""
