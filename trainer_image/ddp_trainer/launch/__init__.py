"""The pod's entrypoint, python -m ddp_trainer.launch: torchrun's elastic agent with ddpjob's rules (agent)
and what the launcher shares with its workers (inplace: restarts in place, their causes, the exit codes never
retried)."""
