"""The final report: a small JSON object for the Kubernetes termination message (< 4096 bytes).

The keys are :class:`ddp_trainer.contract.Report`: the operator reads them back with
:func:`ddp_trainer.contract.parse_report`.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from ddp_trainer.contract import REPORT_LIMIT as LIMIT

log = logging.getLogger(__name__)

MAX_TENSOR_NAMES = 16


def termination_message(report: dict[str, Any], limit: int = LIMIT) -> str:
    """``report`` as compact JSON under ``limit`` bytes: long lists and the message are cut first."""
    report = dict(report)
    names = list(report.get("mismatchedTensors", []))[:MAX_TENSOR_NAMES]
    report["mismatchedTensors"] = names
    report["message"] = str(report.get("message", ""))[:1024]
    if isinstance(report.get("maxAbsDiff"), float) and not math.isfinite(report["maxAbsDiff"]):
        report["maxAbsDiff"] = str(report["maxAbsDiff"])  # JSON has no inf/nan
    while True:
        text = json.dumps(report, separators=(",", ":"), sort_keys=True)
        if len(text.encode()) < limit:
            return text
        if report["mismatchedTensors"]:
            report["mismatchedTensors"] = report["mismatchedTensors"][:-1]
            report["mismatchedTensorsTruncated"] = True
        elif report["message"]:
            report["message"] = report["message"][: len(report["message"]) // 2]
        else:
            raise ValueError(f"report does not fit in {limit} bytes: {text[:200]}")


def write_termination_message(path: str | None, report: dict[str, Any]) -> None:
    """Write the report where Kubernetes looks (``path``); a failure to write is logged, not raised."""
    if not path:
        return
    try:
        Path(path).write_text(termination_message(report))
    except OSError as err:
        log.warning("cannot write the termination message to %s: %s", path, err)
