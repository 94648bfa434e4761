"""What the operator decides from the facts: the reconcile's branches (decision), the gang-restart policy and
its budget (restarts), stalls (stall), the status it writes (status), and the Plan that carries it all
(plan). Pure."""
