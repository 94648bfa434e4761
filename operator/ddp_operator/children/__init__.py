"""The children the operator creates for a DDPJob: a Spec and an attempt rendered into the headless
Service and the Indexed Job (render). Pure."""
