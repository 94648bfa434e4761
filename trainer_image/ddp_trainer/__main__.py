"""Entry point: ``torchrun [launcher args] --module ddp_trainer [trainer args]`` (see ``--help``).

Exit codes are in :mod:`ddp_trainer.contract`; the report goes to the termination message.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

from ddp_trainer import contract
from ddp_trainer.contract import Report
from ddp_trainer.core.config import UsageExit, parse_args, read_pod_env
from ddp_trainer.core.distributed import apply_env_defaults, metrics_dir, read_launch_env
from ddp_trainer.core.inplace import exit_now, write_error_file
from ddp_trainer.reporting import logs


def main(argv: Sequence[str] | None = None) -> int:
    """Run one trainer process; returns its exit code."""
    try:
        config = parse_args(sys.argv[1:] if argv is None else argv)
    except UsageExit as exc:  # argparse said why on stderr; the report says it to the operator
        if os.environ.get("LOCAL_RANK", "0") == "0":
            from ddp_trainer.reporting.report import usage, write_termination_message

            write_termination_message(read_pod_env(os.environ).termination_log, usage(exc.message)[1])
        raise
    launch = read_launch_env(os.environ)
    logging.basicConfig(  # torch's own lines, and those of anything else in this process
        level=logging.INFO if launch.rank == 0 else logging.WARNING, format=logs.line_format(launch.rank)
    )
    log = logs.configure(launch.rank)
    directory = metrics_dir(os.environ, launch)  # before prometheus_client is imported
    # Imported here: torch and prometheus_client must see the environment prepared above.
    import torch

    from ddp_trainer.checkpoint.checkpoints import CheckpointRefused
    from ddp_trainer.core.distributed import pick_device, process_group
    from ddp_trainer.reporting import serving
    from ddp_trainer.reporting.report import failed, termination_message, write_termination_message
    from ddp_trainer.sync import boundary
    from ddp_trainer.sync.checking import DivergenceError
    from ddp_trainer.sync.probe import FaultyRankError
    from ddp_trainer.train import runner

    pod = read_pod_env(os.environ)
    kind = config.resolved_device(torch.cuda.is_available())
    apply_env_defaults(os.environ, kind)
    device = pick_device(kind, launch)
    if launch.local_rank == 0 and pod.metrics_port:
        serving.serve(pod.metrics_port, directory)
    if pod.chaos is not None and pod.chaos.rank >= launch.world_size:
        log.warning(
            "DDPJOB_CHAOS_DIVERGE names rank %d but the world has %d", pod.chaos.rank, launch.world_size
        )
    session: runner.Session | None = None
    code: int
    report: Report
    with process_group(launch, config.resolved_backend(kind), device, config.timeout_seconds):
        # From the moment the group formed, a SIGTERM (the pod deleted, the launcher stopping its workers)
        # is a stop at the next step boundary, with a checkpoint: also while this process still sets up
        # (opening a bucket's client takes a second), where its default action ended it and its peers, in
        # their first collective, failed with "Connection closed by peer" (a preemption taken for a crash).
        # Before the group formed, it ends the process at once: there are no peers to stop with.
        stop = boundary.StopRequest()
        stop.install()
        try:
            session = runner.Session(config, pod, launch, device, config.resolved_precision(kind), stop)
            code, report = session.run()
        except DivergenceError as err:
            assert session is not None
            code, report = session.diverged(err)
        except FaultyRankError as err:  # every rank holds the same verdict; the report names the node
            assert session is not None
            code, report = session.faulty(err)
        except CheckpointRefused as err:  # every rank learns it from rank 0's broadcast; one says it
            assert session is not None
            if launch.rank == 0:
                log.error("%s: %s", err.reason, err)
            code, report = session.refused(err)
        except Exception as err:
            log.exception("trainer failed")
            message = f"{type(err).__name__}: {err}"
            code, report = failed(message) if session is None else session.failed(message)
    if launch.local_rank == 0:  # global rank 0 for the job; every pod's local rank 0 for its own pod
        write_termination_message(pod.termination_log, report)
    if launch.rank == 0:
        log.info("report: %s", termination_message(report))
    if code not in (0, contract.INTERRUPTED_EXIT_CODE):  # the launcher's agent records this as the cause
        write_error_file(f"{report.get('reason', 'TrainerError')}: {report.get('message', '')}")
    return code


if __name__ == "__main__":
    exit_now(main())
