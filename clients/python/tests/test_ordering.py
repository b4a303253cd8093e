"""The outcome goes out when the effect ends, not after a heartbeat
stuck on the network gives up: a proxy holds a heartbeat (the server
never answers it) and the effect ends meanwhile."""

import threading
import unittest
import uuid

import once_client as once

from .proxy import Proxy
from .test_client import intent, server


def heartbeat_threads():
    return [t for t in threading.enumerate() if t.name.startswith("once-heartbeat") and t.is_alive()]


class OrderingTest(unittest.TestCase):
    def test_outcome_is_not_held_back_by_a_stuck_heartbeat(self):
        url, token = server()
        p = Proxy(url)
        self.addCleanup(p.close)
        held, outcome = threading.Event(), threading.Event()
        stuck_at_outcome = []

        def hold(path, body):
            if path == "/v1/heartbeat" and not held.is_set():
                held.set()
                outcome.wait(30)  # the server never sees it while the effect runs
            elif path == "/v1/outcome":
                stuck_at_outcome.append(bool(heartbeat_threads()))
                outcome.set()

        p.hold = hold
        c = once.Client(p.url, token)

        def effect(a):
            if not held.wait(10):
                raise once.RetryLater("no heartbeat came")
            return "sent"

        kind = "py_ordering_" + uuid.uuid4().hex[:8]
        self.assertEqual(once.do(c, intent(kind=kind), effect, policy=once.Policy(lease=3)), "sent")
        self.assertEqual(stuck_at_outcome, [True], "the outcome waited for the stuck heartbeat to give up")

    def test_heartbeat_is_bounded_by_the_lease(self):
        url, token = server()
        p = Proxy(url)
        self.addCleanup(p.close)
        release = threading.Event()
        self.addCleanup(release.set)
        # Held for 20 s, then answered: a heartbeat that waited that long
        # (its request's timeout is 600 s) would get the answer.
        p.hold = lambda path, body: release.wait(20) if path == "/v1/heartbeat" else None
        c = once.Client(p.url, token, timeout=600)
        a = c.claim(intent(kind="py_ordering_" + uuid.uuid4().hex[:8]), policy=once.Policy(lease=2)).attempt
        with self.assertRaises(once.Unreachable):
            a.heartbeat()  # gives up with the lease
        self.assertEqual(a.time_left(), 0)
        release.set()


if __name__ == "__main__":
    unittest.main()
