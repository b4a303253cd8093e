"""A Policy carried by claims and heartbeats (protocol/carried.go): what
the server applies to a kind it does not pin, and refuses for one it
pins ($ONCE_PINNED_KIND, pinned by the kinds file of lab/cli clientKinds
with a two-second lease)."""

import os
import unittest
import uuid

import once_client as once

from .test_client import Counter, client, intent


def unpinned():
    return "py_carried_" + uuid.uuid4().hex[:8]


class PolicyTest(unittest.TestCase):
    def test_carried_lease_is_the_claims(self):
        c = client()
        got = c.claim(intent(kind=unpinned()), policy=once.Policy(lease=5))
        a = got.attempt
        self.assertLessEqual(a.time_left(), 5)
        self.assertEqual(a.heartbeat_every, 1.666)  # a third of the carried lease
        a.heartbeat()  # renews the carried lease, not the server's default
        self.assertLessEqual(a.time_left(), 5)
        self.assertEqual(a.succeed("ok"), "succeeded")
        plain = c.claim(intent(kind=unpinned())).attempt
        self.assertGreater(plain.time_left(), 5, "the server's default lease is 5 s or less: the test tells nothing")
        plain.succeed("ok")

    def test_client_policies_and_do(self):
        kind = unpinned()
        c = client(policies={kind: once.Policy(lease=4, max_execution=30)})
        seen = []

        def fn(a):
            seen.append((a.time_left(), a.heartbeat_every))
            return "ok"

        self.assertEqual(once.do(c, intent(kind=kind), fn), "ok")
        self.assertLessEqual(seen[0][0], 4)
        self.assertEqual(seen[0][1], 1.333)
        self.assertEqual(once.do(c, intent(kind=unpinned()), fn, policy=once.Policy(lease=2)), "ok")
        self.assertLessEqual(seen[1][0], 2)
        r = c.run("py-run-" + uuid.uuid4().hex)
        self.assertEqual(r.do(unpinned(), fn, policy=once.Policy(lease=3)), "ok")
        self.assertLessEqual(seen[2][0], 3)

    def test_carried_recovery_applies_to_the_outcome(self):
        # Under the server's default (ask_person) an unknown outcome goes
        # to review; carried retry_with_provider_key, it is run again.
        c, it = client(), intent(kind=unpinned())
        pol = once.Policy(recovery="retry_with_provider_key")
        keys = []

        def crash(a):
            keys.append(a.provider_key)
            raise RuntimeError("connection reset by the provider")

        with self.assertRaises(RuntimeError):
            once.do(c, it, crash, policy=pol)
        fn = Counter()
        self.assertEqual(once.do(c, it, fn, policy=pol), "sent")
        self.assertEqual(fn.attempts, [(2, keys[0])])

    def test_pinned_kind_refuses_another_policy(self):
        kind = os.environ.get("ONCE_PINNED_KIND")
        if not kind:
            self.skipTest("needs $ONCE_PINNED_KIND, a kind the server pins (TestPythonClient)")
        c = client()
        with self.assertRaises(once.PolicyPinned) as e:
            c.claim(intent(kind=kind), policy=once.Policy(lease=7))
        self.assertIn("pinned", str(e.exception))
        self.assertEqual(once.dispose(e.exception), ("drop", 0))
        same = c.claim(intent(kind=kind), policy=once.Policy(lease=2)).attempt  # the server's own
        self.assertLessEqual(same.time_left(), 2)
        same.succeed("ok")
        plain = c.claim(intent(kind=kind)).attempt
        self.assertLessEqual(plain.time_left(), 2)
        plain.succeed("ok")

    def test_policy_out_of_bounds(self):
        with self.assertRaises(once.BadRequest) as e:
            client().claim(intent(kind=unpinned()), policy=once.Policy(lease=0.5))
        self.assertIn("lease_ms", str(e.exception))

    def test_wire(self):
        self.assertIsNone(once.Policy().wire())
        self.assertEqual(once.Policy(lease=1.5, retention=86400, recovery="ask_person").wire(),
                         {"lease_ms": 1500, "retention_ms": 86400000, "recovery": "ask_person"})


if __name__ == "__main__":
    unittest.main()
