"""What every part of the trainer stands on: its configuration (config), the process group (distributed), the
training state (state) and the unwrapping of DDP and torch.compile wrappers (wrappers)."""
