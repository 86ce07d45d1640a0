"""The lock that lets a test marked ``alone`` run while no other test does under
pytest-xdist (tests/conftest.py, tests/helpers.py): threads stand in for the workers, each with files of its
own, as the workers' processes have."""

import fcntl
import threading
import time

from tests.helpers import turnstile


def test_an_alone_test_waits_for_the_running_ones_and_holds_back_the_next(tmp_path):
    events = []
    running = threading.Event()
    finish_first = threading.Event()

    def shared(name, until=None):
        with turnstile(tmp_path, alone=False):
            events.append(f"{name} starts")
            running.set()
            if until is not None:
                assert until.wait(10)
            events.append(f"{name} ends")

    def alone():
        with turnstile(tmp_path, alone=True):
            events.append("alone starts")
            time.sleep(0.2)
            events.append("alone ends")

    first = threading.Thread(target=shared, args=("first", finish_first))
    first.start()
    assert running.wait(10)
    lone = threading.Thread(target=alone)
    lone.start()
    _wait_until_the_gate_is_held(tmp_path)  # by the alone test, which waits on the first
    later = threading.Thread(target=shared, args=("later",))
    later.start()
    time.sleep(0.3)
    assert events == ["first starts"], "neither the alone test nor a later one started"
    finish_first.set()
    for thread in (first, lone, later):
        thread.join(10)
    assert events == ["first starts", "first ends", "alone starts", "alone ends", "later starts", "later ends"]


def test_tests_that_need_not_be_alone_run_together(tmp_path):
    with turnstile(tmp_path, alone=False):
        done = []
        other = threading.Thread(target=lambda: done.append(_enter_and_leave(tmp_path)))
        other.start()
        other.join(10)
        assert done == [True], "a second shared holder got in while the first held it"


def _enter_and_leave(folder):
    with turnstile(folder, alone=False):
        return True


def _wait_until_the_gate_is_held(folder):
    deadline = time.monotonic() + 30
    with open(folder / "tests.gate", "a") as gate:
        while time.monotonic() < deadline:
            try:
                fcntl.flock(gate, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return
            fcntl.flock(gate, fcntl.LOCK_UN)
            time.sleep(0.01)
    raise AssertionError("the alone test never took the gate")
