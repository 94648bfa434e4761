"""ddpjob's operator side: the DDPJob API (spec), what it becomes (render), and the command line (cli)."""

__version__ = "0.1.0"
