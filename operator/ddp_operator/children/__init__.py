"""The children the operator creates for a DDPJob: a Spec and an attempt rendered into the headless
Service and the Indexed Job (render) and an elastic job's rendezvous store Job (store); all of one
attempt, in creation order (objects). Pure."""
