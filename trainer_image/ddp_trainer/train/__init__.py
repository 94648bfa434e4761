"""The built-in trainer: the session that assembles it (runner), the loop (loop), the step boundary
(boundary), the deferred loss read (lossread), the model, the data and users' factories."""
