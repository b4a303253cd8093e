"""The client verifier (Verifier, Client.verify, Client.verify_once)
against a real server whose kinds file has $ONCE_VERIFIED_KIND verified
by clients, with a one-second lease (lab/cli clientKinds). The server's
reaper is off: a duplicate's claim meets the dead claim and recovers it
inline, asking the verifier, as docs/protocol.md says."""

import json
import os
import threading
import time
import unittest

import once_client as once

from .proxy import Proxy
from .test_client import Counter, client, intent, server


def verified_kind(test):
    k = os.environ.get("ONCE_VERIFIED_KIND")
    if not k:
        test.skipTest("needs $ONCE_VERIFIED_KIND, a kind the server has verified by clients (TestPythonClient)")
    return k


def dead_claim(test, c, payload=None):
    """An intent of the verified kind whose claim's worker died: its lease
    has lapsed, by the server's clock too."""
    it = intent(kind=verified_kind(test), payload=payload if payload is not None else {"subject": "hello"})
    got = c.claim(it)
    test.assertIsInstance(got, once.Claimed)
    a = got.attempt
    time.sleep(a.time_left())  # its worker died; the lease lapses
    # The client's count starts when it sent the claim, before the server
    # made it: wait until the server's clock has the lease lapsed too, or
    # a loaded machine's duplicate meets a claim still held.
    end = time.monotonic() + 30
    while c.get(a.key).get("lease_left_ms"):
        test.assertLess(time.monotonic(), end, "the dead claim's lease did not lapse by the server's clock")
        time.sleep(0.05)
    return it, a


def in_thread(fn, *args):
    out = {}

    def run():
        try:
            out["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


class VerifierTest(unittest.TestCase):
    def test_landed_decides_the_dead_claim(self):
        c = client()
        it, dead = dead_claim(self, c)
        asked = []

        def fn(q):
            asked.append(q)
            return once.landed({"id": "msg-1"})

        t, out = in_thread(c.verify_once, [it.kind], fn, 10.0)
        got = c.claim(it)  # the duplicate meets the dead claim: recovery asks
        t.join(15)
        self.assertEqual(out, {"value": 1})
        self.assertIsInstance(got, once.Replayed)
        self.assertEqual(got.result, {"id": "msg-1"})
        q = asked[0]
        self.assertEqual((q.key, q.attempt, q.kind, q.run, q.step, q.target), (dead.key, 1, it.kind, it.run, 0, it.target))
        self.assertEqual((q.provider_key, q.payload, q.raw), (dead.provider_key, {"subject": "hello"}, None))
        self.assertGreater(q.answer_within, 0)
        a = c.get(dead.key)
        self.assertEqual((a["status"], a["attempt"], a["result"]), ("succeeded", 1, {"id": "msg-1"}))

    def test_not_landed_runs_it_again(self):
        c = client()
        it, dead = dead_claim(self, c)
        stop = threading.Event()
        asked = []

        def fn(q):
            asked.append(q.key)
            return once.not_landed() if q.key == dead.key else once.cannot_tell("not this test's question")

        t, out = in_thread(c.verify, [it.kind], fn, stop, 1.0)
        fn2 = Counter({"id": "msg-2"})
        try:
            self.assertEqual(once.do(c, it, fn2), {"id": "msg-2"})
        finally:
            stop.set()
            t.join(15)
        self.assertFalse(t.is_alive(), "the verifier loop did not end when stop was set")
        self.assertEqual(out, {"value": None})
        self.assertEqual(asked, [dead.key])
        self.assertEqual(fn2.attempts, [(2, dead.provider_key)])
        a = c.get(dead.key)
        self.assertEqual((a["status"], a["attempt"]), ("succeeded", 2))

    def test_a_verifier_that_raises_cannot_tell(self):
        c = client()
        it, dead = dead_claim(self, c)

        def broken(q):
            raise RuntimeError("the provider's search is down " + "x" * 40000)  # over what the server keeps

        t, out = in_thread(c.verify_once, [it.kind], broken, 10.0)
        with self.assertRaises((once.OutcomeUnknown, once.InFlight)):
            c.claim(it)
        t.join(15)
        self.assertEqual(out, {"value": 1}, "the cannot_tell answer was not received")
        self.assertEqual(c.get(dead.key)["attempt"], 1)
        # Asked again after the kind's verify_backoff: this time it landed.
        t, out = in_thread(c.verify_once, [it.kind], lambda q: once.landed("found"), 15.0)
        end = time.monotonic() + 15
        while True:
            try:
                got = c.claim(it)
                break
            except (once.OutcomeUnknown, once.InFlight) as e:
                if time.monotonic() > end:
                    raise
                time.sleep(max(e.retry_after, 0.2))
        t.join(15)
        self.assertEqual(out, {"value": 1})
        self.assertIsInstance(got, once.Replayed)
        self.assertEqual(got.result, "found")

    def test_a_result_not_json_cannot_tell(self):
        c = client()
        it, dead = dead_claim(self, c)
        v = once.Verifier(c, it.kind, lambda q: once.landed({"ids": {1, 2}}), wait=10.0)
        self.assertEqual(v.verdict(once.Question("q", dead.key, 1, it.kind, it.run, 0, "", "", None, None, "", 0))["verdict"],
                         "cannot_tell")
        t, out = in_thread(v.verify_once)
        with self.assertRaises((once.OutcomeUnknown, once.InFlight)):
            c.claim(it)
        t.join(15)
        self.assertEqual(out, {"value": 1})
        self.assertNotEqual(c.get(dead.key)["status"], "succeeded")

    def test_answer_sent_again_when_its_reply_is_lost(self):
        url, token = server()
        p = Proxy(url)
        self.addCleanup(p.close)
        cut = []

        def cut_first_answer(path, body):
            if path == "/v1/verify/answer" and not cut:
                cut.append(body)
                return True
            return False

        p.cut = cut_first_answer
        c, via = client(), once.Client(p.url, token)
        it, dead = dead_claim(self, c)
        t, out = in_thread(via.verify_once, [it.kind], lambda q: once.landed({"id": "msg-3"}), 10.0)
        got = c.claim(it)
        t.join(15)
        self.assertEqual(out, {"value": 1})
        self.assertEqual(got.result, {"id": "msg-3"})
        answers = [json.loads(b) for path, b in p.seen if path == "/v1/verify/answer"]
        self.assertEqual(len(answers), 2, "the answer whose reply was lost was not sent again")
        self.assertEqual(answers[0], answers[1])

    def test_take_of_a_kind_not_client_verified(self):
        with self.assertRaises(once.NotClientVerified):
            client().verify_once(["send_email"], lambda q: once.not_landed(), wait=0)

    def test_verify_once_with_no_question(self):
        self.assertEqual(client().verify_once([verified_kind(self)], lambda q: once.not_landed(), wait=0.2), 0)


if __name__ == "__main__":
    unittest.main()
