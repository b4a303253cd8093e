"""once_client.aio against the real server."""

import asyncio
import unittest
import uuid

import once_client as once
from once_client import aio

from .test_client import intent, server


def aclient(**kw):
    url, token = server()
    return aio.AsyncClient(url, token, **kw)


class AsyncTest(unittest.IsolatedAsyncioTestCase):
    async def test_do_runs_once_and_replays(self):
        c, it, ran = aclient(), intent(payload={"subject": "hi"}), []

        async def send(a):
            self.assertIsInstance(a.stop, asyncio.Event)
            ran.append((a.number, a.provider_key))
            await asyncio.sleep(0)
            return {"id": "msg-1"}

        self.assertEqual(await aio.do(c, it, send), {"id": "msg-1"})
        self.assertEqual(await aio.do(c, it, send), {"id": "msg-1"})
        self.assertEqual(len(ran), 1)
        self.assertEqual((await c.get(it.keys()[0]))["status"], "succeeded")

    async def test_retry_later_and_permanent(self):
        c, it = aclient(), intent()

        async def busy(a):
            raise once.RetryLater("429")

        with self.assertRaises(once.RetryLater):
            await aio.do(c, it, busy)
        self.assertEqual(await aio.do(c, it, lambda a: "sync fn"), "sync fn")
        it2 = intent()

        async def bounce(a):
            raise once.Permanent("550")

        with self.assertRaises(once.Permanent):
            await aio.do(c, it2, bounce)
        with self.assertRaises(once.Failed):
            await aio.do(c, it2, bounce)

    async def test_heartbeat_task_renews_the_claim(self):
        c = aclient()
        seen = {}

        async def slow(a):
            await asyncio.sleep(1.6)  # past the one-second lease: heartbeats renew it
            seen["left"], seen["stop"] = a.time_left(), a.stop.is_set()
            return "done"

        kind = "py_aio_" + uuid.uuid4().hex[:8]
        self.assertEqual(await aio.do(c, intent(kind=kind), slow, policy=once.Policy(lease=1)), "done")
        self.assertGreater(seen["left"], 0)
        self.assertFalse(seen["stop"])

    async def test_cancelled_effect_is_recorded_unknown(self):
        c, it = aclient(), intent()
        started = asyncio.Event()

        async def hang(a):
            started.set()
            await asyncio.sleep(60)

        task = asyncio.create_task(aio.do(c, it, hang))
        await started.wait()
        task.cancel()
        with self.assertRaises(asyncio.CancelledError):
            await task
        self.assertNotEqual((await c.get(it.keys()[0]))["status"], "in_flight")

    async def test_result_not_json_and_run(self):
        c, it = aclient(), intent()
        with self.assertRaises(once.ResultNotJSON) as e:
            await aio.do(c, it, lambda a: {"at": object()})
        self.assertEqual(e.exception.path, "result.at")
        r = c.run("py-aio-run-" + uuid.uuid4().hex)
        self.assertEqual(await r.do("send_email", lambda a: "m", target="ada@example.com"), "m")
        self.assertEqual(await r.do("send_email", lambda a: "n", target="ada@example.com"), "n")
        self.assertEqual(r.next, 2)

    async def test_claim_in_flight(self):
        c, it = aclient(), intent()
        got = await c.claim(it)
        with self.assertRaises(once.InFlight):
            await c.claim(it)
        await got.attempt.heartbeat()
        self.assertEqual(await got.attempt.succeed("ok"), "succeeded")
        with self.assertRaises(once.Fenced):
            await got.attempt.heartbeat()
        self.assertTrue(got.attempt.stop.is_set())


if __name__ == "__main__":
    unittest.main()
