"""Values that are not JSON, or whose JSON another language would read
otherwise: a payload is refused before any request, naming its path; an
effect's result is recorded as outcome unknown, naming its path, so the
attempt is not left in flight."""

import decimal
import unittest

import once_client as once

from .test_client import client, intent

NOWHERE = once.Client("http://127.0.0.1:9", "x" * 20, timeout=0.5, retry_for=0.1)


class PayloadTest(unittest.TestCase):
    def test_refused_before_any_request(self):
        loop = []
        loop.append(loop)
        for payload, want in [
            ({"amount": float("nan")}, "payload.amount: float nan is not JSON"),
            ({"amount": float("inf")}, "payload.amount: float inf is not JSON"),
            ({"to": [{"name": "ada", 1: "x"}]}, "payload.to[0][1]: a dict key of type int is not JSON"),
            ({"body": b"hi"}, "payload.body: bytes is not JSON"),
            ({"items": [1, 2, {3}]}, "payload.items[2]: set is not JSON"),
            ({"at": object()}, "payload.at: object is not JSON"),
            ({"cents": decimal.Decimal("1.10")}, "payload.cents: Decimal is not JSON"),
            ({"id": 2 ** 53 + 1}, "payload.id: int 9007199254740993 is beyond 2**53, and its canonical JSON is another number"),
            ({"id": 10 ** 400}, "payload.id: int 1000"),
            ({"a b": loop}, 'payload["a b"][0]: a circular reference is not JSON'),
        ]:
            with self.subTest(want=want):
                with self.assertRaises(once.NotJSON) as e:
                    NOWHERE.claim(intent(payload=payload))  # never Unreachable: nothing is sent
                self.assertIn(want, str(e.exception))
                self.assertEqual(once.dispose(e.exception), ("drop", 0))
                with self.assertRaises(once.NotJSON):
                    once.key_of("r", 0, "k", payload=payload)

    def test_a_big_int_a_double_holds_is_json(self):
        self.assertEqual(once.do(client(), intent(payload={"n": 999999999999999900000}), lambda a: "ok"), "ok")

    def test_tuples_are_arrays(self):
        c = client()
        it, as_list = intent(payload={"to": ("ada", "bob")}), intent(payload={"to": ["ada", "bob"]})
        as_list.run = it.run
        self.assertEqual(it.keys(), as_list.keys())
        self.assertEqual(once.do(c, it, lambda a: ("sent", 2)), ("sent", 2))
        self.assertEqual(once.do(c, as_list, lambda a: "again"), ["sent", 2])  # a tuple comes back a list


class ResultTest(unittest.TestCase):
    def test_result_not_json_is_recorded_unknown(self):
        c, it = client(), intent()
        with self.assertRaises(once.ResultNotJSON) as e:
            once.do(c, it, lambda a: {"items": [1, 2, {3}]})
        self.assertEqual(str(e.exception), "result.items[2]: set is not JSON")
        self.assertEqual((e.exception.path, e.exception.key, e.exception.attempt), ("result.items[2]", it.keys()[0], 1))
        self.assertEqual(once.dispose(e.exception), ("drop", 0))
        a = c.get(it.keys()[0])
        self.assertNotEqual(a["status"], "in_flight")
        self.assertEqual(a["status"], e.exception.status)
        self.assertIn("result.items[2]: set is not JSON", a["error"])

    def test_succeed_refuses_before_sending(self):
        c, it = client(), intent()
        a = c.claim(it).attempt
        with self.assertRaises(once.NotJSON):
            a.succeed({"n": float("nan")})
        self.assertEqual(c.get(it.keys()[0])["status"], "in_flight")  # still held: the caller settles it
        self.assertEqual(a.succeed({"n": 2 ** 60}), "succeeded")  # a result keeps a big int as it is
        self.assertEqual(once.do(c, it, lambda a: None), {"n": 2 ** 60})


if __name__ == "__main__":
    unittest.main()
