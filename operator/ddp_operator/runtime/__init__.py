"""Where the operator meets the API server: Kopf's handlers and indexes, the reconcile entry point that
carries a Plan out (reconcile), read-your-writes (recent), the timer, the metrics scraper, the Lease, the heap
and the operator's own metrics. I/O lives here."""
