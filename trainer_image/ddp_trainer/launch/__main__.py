"""``python -m ddp_trainer.launch``: the trainer image's ENTRYPOINT (``launch/agent.py``)."""

import sys

from ddp_trainer.launch.agent import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
