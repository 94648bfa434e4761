"""What a run says: the termination report (report) and the ddp_* Prometheus series (metrics)."""
