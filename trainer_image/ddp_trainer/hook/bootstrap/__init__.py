"""What ``python -m ddp_trainer.inject`` puts first on a pod's ``PYTHONPATH``: ``sitecustomize.py``, the
no-code-change hook's entry (docs/your-code.md, "1. Nothing"). Nothing here is imported as part of this
package; the file runs only as ``sitecustomize``.
"""
