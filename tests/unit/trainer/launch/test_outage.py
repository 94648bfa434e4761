"""An elastic agent that must meet the others while its rendezvous store does not answer
(launch/outage): it says what it waits for and for how long, again every 10 s, gives up after the limit,
and reaches the store again through its round's watch (a new client, the round restored into a store that
came back empty, itself announced to the store's process watch)."""

from __future__ import annotations

from typing import Any

from ddp_trainer.launch import outage
from ddp_trainer.launch.store import WAIT_SAY_EVERY


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _error() -> Exception:
    exc = RuntimeError("The connection to the C10d store has failed. See inner exception for details.")
    exc.__cause__ = OSError("Broken pipe")
    return exc


def test_a_wait_for_the_store_says_what_it_waits_for_then_every_ten_seconds_then_gives_up() -> None:
    said: list[str] = []
    clock = _Clock()
    wait = outage.StoreWait("rdzv.job:29400", limit=60, say=said.append, clock=clock)
    assert wait.missed(_error())
    assert said == [
        "[launcher] the rendezvous store at rdzv.job:29400 does not answer as this node meets the others at "
        "the next round (The connection to the C10d store has failed. See inner exception for details.; "
        "Broken pipe): waiting for it, up to 60 s (a lost store's pod is replaced by its Job); the world "
        "re-forms once it answers"
    ]
    for _ in range(int(WAIT_SAY_EVERY / outage.POLL_SECONDS) - 1):  # each try, 0.5 s apart: said once
        clock.now += outage.POLL_SECONDS
        assert wait.missed(_error())
    assert len(said) == 1
    clock.now += outage.POLL_SECONDS
    assert wait.missed(_error()) and said[-1] == (
        "[launcher] still waiting for the rendezvous store at rdzv.job:29400: 10 s of 60 s"
    )
    clock.now = 100.0 + 60
    assert not wait.missed(_error())
    assert said[-1].startswith("[launcher] the rendezvous store at rdzv.job:29400 did not answer in 60 s (")
    assert said[-1].endswith("): this pod fails (exit 1) and is replaced")


def test_a_store_that_answers_again_is_said_with_the_time_waited_and_the_rounds() -> None:
    said: list[str] = []
    clock = _Clock()
    wait = outage.StoreWait("rdzv.job:29400", say=said.append, clock=clock)
    wait.missed(_error())
    clock.now += 12.4
    wait.reached()
    clock.now += 3.2
    wait.answered()
    assert said[-1] == (
        "[launcher] the rendezvous store at rdzv.job:29400 answered again after 12 s; this node met the "
        "others at the next round 3 s later"
    )


class _Watch:
    """A stand-in for rounds.RoundWatch: what reach calls, in order."""

    def __init__(self, answers: bool = True, state: Any = None, presence: bool = True) -> None:
        self.answers, self.state, self.presence = answers, state, presence
        self.calls: list[str] = []
        self.failed_reads = 3

    def reconnect(self) -> None:
        self.calls.append("reconnect")
        if not self.answers:
            raise ConnectionRefusedError(111, "Connection refused")

    def read_state(self) -> Any:
        self.calls.append("read")
        return self.state

    def restore(self) -> None:
        self.calls.append("restore")

    def announce(self) -> None:
        self.calls.append("announce")


def test_reaching_a_store_that_came_back_empty_restores_the_round_and_announces_this_agent() -> None:
    watch = _Watch(state=None)
    assert outage.reach(watch)
    assert watch.calls == ["reconnect", "read", "restore", "announce"] and watch.failed_reads == 0


def test_reaching_a_store_that_holds_the_round_restores_nothing() -> None:
    watch = _Watch(state=(b"state", b"token"), presence=False)
    assert outage.reach(watch) and watch.calls == ["reconnect", "read"]


def test_a_store_that_does_not_answer_yet_is_not_reached() -> None:
    watch = _Watch(answers=False)
    assert not outage.reach(watch)
    assert watch.calls == ["reconnect"] and watch.failed_reads == 3
