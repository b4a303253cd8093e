"""The client against a real once server: $ONCE_URL, with a worker's token
in $ONCE_TOKEN and an operator's in $ONCE_OPERATOR_TOKEN. The Go test
TestPythonClient (lab/cli) starts `once serve` over SQLite and over
PostgreSQL and runs this suite against each."""

import json
import os
import time
import unittest
import uuid

import once_client as once


def server():
    url = os.environ.get("ONCE_URL")
    if not url:
        raise RuntimeError("set ONCE_URL and ONCE_TOKEN to a once server (`once serve --worker-tokens-file`), "
                           "or run the Go test TestPythonClient, which starts one")
    return url, os.environ["ONCE_TOKEN"]


def client(**kw):
    url, token = server()
    return once.Client(url, token, **kw)


def intent(step=0, payload=None, kind="send_email"):
    return once.Intent("py-" + uuid.uuid4().hex, step, kind, "ada@example.com", payload)


class Counter:
    def __init__(self, result="sent"):
        self.n, self.result, self.attempts = 0, result, []

    def __call__(self, attempt):
        self.n += 1
        self.attempts.append((attempt.number, attempt.provider_key))
        return self.result


class ClientTest(unittest.TestCase):
    def test_do_runs_once_and_replays(self):
        c, it, fn = client(), intent(payload={"subject": "hello"}), Counter({"id": "msg-1"})
        self.assertEqual(once.do(c, it, fn), {"id": "msg-1"})
        self.assertEqual(once.do(c, it, fn), {"id": "msg-1"})
        self.assertEqual(fn.n, 1)
        self.assertEqual(c.get(it.keys()[0])["status"], "succeeded")

    def test_duplicate_meets_claim_in_flight(self):
        c, it = client(), intent()
        got = c.claim(it)
        self.assertIsInstance(got, once.Claimed)
        with self.assertRaises(once.InFlight) as e:
            c.claim(it)
        self.assertGreater(e.exception.retry_after, 0)
        self.assertEqual(once.dispose(e.exception)[0], "retry")
        got.attempt.heartbeat()
        self.assertGreater(got.attempt.time_left(), 0)
        self.assertEqual(got.attempt.succeed("ok"), "succeeded")
        with self.assertRaises(once.Fenced):
            got.attempt.heartbeat()
        self.assertTrue(got.attempt.stop.is_set())

    def test_changed_payload_refused(self):
        c, it = client(), intent(payload={"n": 1})
        once.do(c, it, Counter())
        it.payload = {"n": 2}
        with self.assertRaises(once.FingerprintMismatch) as e:
            once.do(c, it, Counter())
        self.assertEqual(once.dispose(e.exception)[0], "drop")

    def test_retry_later_is_run_again_with_the_same_provider_key(self):
        c, it = client(), intent()
        first = []

        def busy(a):
            first.append(a.provider_key)
            raise once.RetryLater("429 slow down")

        with self.assertRaises(once.RetryLater):
            once.do(c, it, busy)
        fn = Counter()
        self.assertEqual(once.do(c, it, fn), "sent")
        self.assertEqual(fn.attempts, [(2, first[0])])

    def test_permanent_failure_is_told_to_every_duplicate(self):
        c, it = client(), intent()

        def bounce(a):
            raise once.Permanent("550 no such mailbox")

        with self.assertRaises(once.Permanent):
            once.do(c, it, bounce)
        fn = Counter()
        with self.assertRaises(once.Failed) as e:
            once.do(c, it, fn)
        self.assertIn("550 no such mailbox", str(e.exception))
        self.assertEqual(fn.n, 0)
        self.assertEqual(once.dispose(e.exception), ("ack", 0))

    def test_claim_sent_again_gets_the_same_attempt(self):
        # The reply of a claim that won is lost; the client sends the same
        # request again, as _call does on a cut connection.
        c, it = client(), intent()
        body = {"intent": it.wire(), "write": once.write_token()}
        first = c._call("POST", "/v1/claim", body)
        again = c._call("POST", "/v1/claim", body)
        self.assertEqual((again["answer"], again["attempt"], again["token"]), ("claimed", first["attempt"], first["token"]))

    def test_a_key_computed_otherwise_is_refused(self):
        c, it = client(), intent()
        body = {"intent": it.wire(), "write": once.write_token(), "key": "0" * 64}
        with self.assertRaises(once.KeyMismatch):
            c._call("POST", "/v1/claim", body)
        self.assertEqual(c.keys(it), it.keys())

    def test_invalid_intent_names_the_field(self):
        c = client()
        with self.assertRaises(once.InvalidIntent) as e:
            c.claim(once.Intent("", 0, "send_email"))
        self.assertEqual(e.exception.field, "Run")

    def test_run_numbers_steps(self):
        c = client()
        run_id = "py-run-" + uuid.uuid4().hex
        ran = []
        for _ in range(2):  # the run, then the run resumed
            r = c.run(run_id)
            r.do("send_email", lambda a: ran.append("mail") or "m", target="ada@example.com")
            r.do("charge_card", lambda a: ran.append("charge") or "c", target="acct-1", payload={"cents": 100})
        self.assertEqual(ran, ["mail", "charge"])

    def test_bad_token_is_refused(self):
        url, _ = server()
        with self.assertRaises(once.Unauthorized):
            once.Client(url, "not-a-token-of-this-server").claim(intent())

    def test_unreachable_server(self):
        c = once.Client("http://127.0.0.1:9", "x" * 20, timeout=0.5, retry_for=0.3)
        start = time.monotonic()
        with self.assertRaises(once.Unreachable):
            c.claim(intent())
        self.assertLess(time.monotonic() - start, 5)

    def test_raw_payload(self):
        c = client()
        it = once.Intent("py-" + uuid.uuid4().hex, 0, "send_email", raw=b'"hi"')
        once.do(c, it, Counter())
        self.assertEqual(c.get(it.keys()[0])["fingerprint"], it.keys()[1])
        self.assertEqual(json.dumps(c.get(it.keys()[0])["status"]), '"succeeded"')


if __name__ == "__main__":
    unittest.main()
