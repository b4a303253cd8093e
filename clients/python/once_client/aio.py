"""An asyncio client of once's protocol: client, run and do as in
once_client, awaited.

    from once_client import Intent
    from once_client.aio import AsyncClient, do

    c = AsyncClient("http://127.0.0.1:7070", token)
    receipt = await do(c, Intent("order-981", 0, "send_email", "ada@example.com", {"subject": "hi"}),
                       send)  # async def send(attempt): ...

Standard library only: each request is the blocking client's, run in a
thread (asyncio.to_thread), so the event loop never waits on the network.
The heartbeat is a task; attempt.stop is an asyncio.Event the effect
heeds.
"""

import asyncio
import inspect

from .client import (
    Claimed,
    Client,
    Fenced,
    LeaseSpent,
    NotJSON,
    OnceError,
    Permanent,
    ResultNotJSON,
    RetryLater,
    Intent,
    _Raw,
    result_json,
)

__all__ = ["AsyncAttempt", "AsyncClient", "AsyncRun", "do"]


class AsyncAttempt:
    """A claimed attempt (once_client's Attempt), awaited. stop is set when
    the claim cannot be renewed in time or its max_execution passed: the
    effect must stop then."""

    def __init__(self, attempt):
        self._a = attempt
        self.key, self.number, self.token = attempt.key, attempt.number, attempt.token
        self.provider_key, self.heartbeat_every, self.policy = attempt.provider_key, attempt.heartbeat_every, attempt.policy
        self.stop = asyncio.Event()

    def ref(self):
        return self._a.ref()

    def deadline(self):
        return self._a.deadline()

    def time_left(self):
        return self._a.time_left()

    async def heartbeat(self):
        """Renew the claim. Raises Fenced (and sets stop) when the attempt
        is over."""
        try:
            await asyncio.to_thread(self._a.heartbeat)
        except Fenced:
            self.stop.set()
            raise

    async def succeed(self, result=None):
        return await asyncio.to_thread(self._a.succeed, result)

    async def fail(self, error):
        return await asyncio.to_thread(self._a.fail, error)

    async def release(self, error):
        return await asyncio.to_thread(self._a.release, error)

    async def unknown(self, error):
        return await asyncio.to_thread(self._a.unknown, error)


class AsyncClient:
    """once_client.Client, awaited: the same arguments."""

    def __init__(self, url, token, **kw):
        self.sync = Client(url, token, **kw)

    @classmethod
    def from_env(cls):
        c = cls.__new__(cls)
        c.sync = Client.from_env()
        return c

    async def _call(self, method, path, body=None, budget=None):
        return await asyncio.to_thread(self.sync._call, method, path, body, budget)

    async def keys(self, intent):
        return await asyncio.to_thread(self.sync.keys, intent)

    async def claim(self, intent, wait=0.0, policy=None):
        """Client.claim: Claimed with an AsyncAttempt, or Replayed."""
        got = await asyncio.to_thread(self.sync.claim, intent, wait, policy)
        if isinstance(got, Claimed):
            return Claimed(AsyncAttempt(got.attempt))
        return got

    async def get(self, key):
        return await asyncio.to_thread(self.sync.get, key)

    def run(self, run_id):
        return AsyncRun(self, run_id)


async def do(client, intent, fn, wait=0.0, policy=None):
    """once_client.do, awaited: fn(attempt) is awaited (a coroutine
    function, or a function returning an awaitable or a value) while a
    task heartbeats the claim. The outcome is sent as soon as fn ends; a
    do cancelled while fn runs records the outcome unknown (the effect
    may have happened) and is cancelled."""
    got = await client.claim(intent, wait=wait, policy=policy)
    if not isinstance(got, Claimed):
        return got.result
    a = got.attempt
    if a.time_left() <= 0:
        a.stop.set()
        try:
            await a.release(RetryLater("the claim's answer came after its lease was spent; nothing was started"))
        except OnceError:
            pass
        raise LeaseSpent({"code": "lease_spent", "key": a.key, "attempt": a.number, "retry_after_ms": 1000,
                          "detail": "once: the claim of %s came back after its lease was spent; the effect was not started: deliver the job again" % a.key})
    done = asyncio.Event()

    async def beat():
        while True:
            try:
                await asyncio.wait_for(done.wait(), max(0.05, min(a.heartbeat_every, a.time_left() / 2)))
                return
            except asyncio.TimeoutError:
                pass
            if a.time_left() <= 0:
                a.stop.set()
                return
            try:
                await a.heartbeat()
            except Fenced:
                return
            except OnceError:
                pass  # tried again at the next beat; time_left runs out meanwhile

    hb = asyncio.create_task(beat(), name="once-heartbeat " + a.key[:12])
    try:
        try:
            result = fn(a)
            if inspect.isawaitable(result):
                result = await result
        except RetryLater as e:
            done.set()
            await a.release(e)
            raise
        except Permanent as e:
            done.set()
            await a.fail(e)
            raise
        except BaseException as e:
            done.set()
            await a.unknown(e)
            raise
        done.set()
        try:
            text = result_json(result)
        except NotJSON as e:
            status = await a.unknown(e)
            raise ResultNotJSON(e, a.key, a.number, status) from None
        await asyncio.to_thread(a._a._settle, "succeeded", result=_Raw(text))
        return result
    finally:
        done.set()
        hb.cancel()
        await asyncio.gather(hb, return_exceptions=True)


class AsyncRun:
    """The steps of one run, numbered in order (once_client.Run)."""

    def __init__(self, client, run_id):
        self.client, self.id, self.next = client, run_id, 0

    async def do(self, kind, fn, target="", payload=None, raw=None, payload_in_key=False, wait=0.0, policy=None):
        step = self.next
        self.next += 1
        return await do(self.client, Intent(self.id, step, kind, target, payload, raw, payload_in_key), fn, wait=wait, policy=policy)
