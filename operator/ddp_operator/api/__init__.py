"""The DDPJob API: the CRD (crds/, the one source), its rules offline (schema), the parsed Spec, what the API
server would refuse at Job creation (podcheck), the names every part shares and every phase, condition and
event reason (reasons). Pure; imports nothing else of the operator."""
