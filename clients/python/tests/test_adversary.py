"""The review of the Python client (branch review-protocol): each test here
failed when it was written. They run against a real server: the Go test
TestPythonClientAdversary (package protocol) serves kind adv_short with a
one-second lease; under `once serve` (TestPythonClient) the test that
needs that lease skips."""

import time
import unittest

import once_client as once

from .test_client import Counter, client, intent, server


class LateReply(once.Client):
    """A client whose claim's answer comes in after the claim's lease: the
    reply was slow on the way (a proxy, a congested link), or the worker
    paused (GC, a stopped container) as it came in. during runs
    meanwhile."""

    def __init__(self, url, token, during=None, **kw):
        super().__init__(url, token, **kw)
        self.during = during

    def _call(self, method, path, body=None, budget=None):
        a = super()._call(method, path, body, budget)
        if path == "/v1/claim" and a.get("answer") == "claimed" and self.during:
            time.sleep(a["stop_after_ms"] / 1000.0 + 0.8)  # past the lease the server holds, too
            during, self.during = self.during, None
            during()
        return a


class Careful(Counter):
    """An effect that heeds attempt.stop before it starts."""

    def __call__(self, attempt):
        if attempt.stop.is_set():
            raise once.RetryLater("told to stop before it started")
        return super().__call__(attempt)


class AdversaryTest(unittest.TestCase):
    def test_do_does_not_start_the_effect_with_its_lease_spent(self):
        """do() runs fn whatever time the claim left, with attempt.stop not
        set yet: a claim whose answer came after its lease ran the effect
        (one that heeds stop) while another worker, which took the lapsed
        claim over, ran it too. The Go engine refuses to start an effect
        whose lease is spent (errLeaseSpent)."""
        c, probe = client(), intent(kind="adv_short")
        got = c.claim(probe)
        if got.attempt.time_left() > 5:
            self.skipTest("needs kind adv_short served with a short lease (TestPythonClientAdversary)")
        got.attempt.succeed("probe")
        url, token = server()
        it, runs, other = intent(kind="adv_short"), Careful(), client()
        late = LateReply(url, token, during=lambda: once.do(other, it, runs))
        try:
            once.do(late, it, runs)
        except once.OnceError:
            pass
        self.assertEqual(runs.n, 1, "the effect ran %d times: attempts %s" % (runs.n, runs.attempts))

    def test_claim_that_waits_longer_than_a_request_is_answered(self):
        """A claim may wait up to a minute (wait), but each request is cut
        at timeout (30 s by default): a wait longer than that is never
        answered. The client sends it again, and raises Unreachable
        though the server answers in_flight, leaving its waits running
        on the server."""
        c, it = client(), intent()
        held = c.claim(it)
        try:
            slow = client(timeout=1.0, retry_for=0.5)
            try:
                slow.claim(it, wait=1.5)
                self.fail("a claim of an action held was claimed")
            except once.InFlight:
                pass
            except once.Unreachable as e:
                self.fail("a claim that waited 1.5 s with a 1 s request timeout: %r; want InFlight" % e)
        finally:
            held.attempt.succeed("ok")


if __name__ == "__main__":
    unittest.main()
