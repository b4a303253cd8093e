"""A thin client of once's protocol (/v1, docs/protocol.md).

The rules live in the server: this module claims, heartbeats and records
outcomes, and turns the server's answers into values and exceptions. It
keeps no state of its own beyond the attempt it holds.

Time is measured with time.monotonic from when a request was sent, as the
protocol asks: the server's durations are counted from when it received
the request, so the client's count ends first.
"""

import base64
import dataclasses
import http.client
import json
import logging
import os
import secrets
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

from .keys import JSON_NULL, NotJSON, key_of, payload_json

log = logging.getLogger("once_client")

# --- errors -----------------------------------------------------------------


class OnceError(Exception):
    """An answer of the server that is not a claim: its problem's code,
    HTTP status and fields."""

    code = ""

    def __init__(self, problem, status=0):
        super().__init__(problem.get("detail") or problem.get("code") or "once: error")
        self.problem = problem
        self.status = status
        self.key = problem.get("key", "")
        self.attempt = problem.get("attempt", 0)
        self.retry_after = problem.get("retry_after_ms", 0) / 1000.0


class InFlight(OnceError):
    """Another attempt holds the action: ask again after retry_after."""

    code = "in_flight"


class OutcomeUnknown(OnceError):
    """The action's outcome is unknown, and recovery has not decided."""

    code = "outcome_unknown"


class Review(OnceError):
    """A person decides whether the action happened."""

    code = "review"


class AwaitingApproval(OnceError):
    """A person must approve the action before it runs."""

    code = "awaiting_approval"


class Fenced(OnceError):
    """The attempt is over: stop the effect."""

    code = "fenced"


class Conflict(OnceError):
    """Another outcome of the attempt was recorded first."""

    code = "conflict"


class FingerprintMismatch(OnceError):
    """The key was first claimed with another payload."""

    code = "fingerprint_mismatch"


class KeyMismatch(OnceError):
    """The key this client computed is not the server's."""

    code = "key_mismatch"


class InvalidIntent(OnceError):
    """The intent breaks a rule: field and reason say which."""

    code = "invalid_intent"

    def __init__(self, problem, status=0):
        super().__init__(problem, status)
        self.field = problem.get("field", "")
        self.reason = problem.get("reason", "")


class StoreUnavailable(OnceError):
    """The server could not reach its database; nothing ran."""

    code = "store_unavailable"


class NotRecorded(OnceError):
    """The outcome could not be recorded; send it again."""

    code = "not_recorded"


class Unauthorized(OnceError):
    code = "unauthorized"


class Forbidden(OnceError):
    code = "forbidden"


class BadRequest(OnceError):
    code = "bad_request"


class NotFound(OnceError):
    code = "not_found"


class LeaseSpent(OnceError):
    """The claim's answer came after its lease was spent: the effect was
    not started (another worker may be taking the claim over), and the
    claim was given back. Deliver the job again."""

    code = "lease_spent"


class Unreachable(OnceError):
    """The server did not answer, after every try."""

    code = "unreachable"


class PolicyPinned(OnceError):
    """The kind's policy is the server's (its kinds file), and the claim
    carried another: drop the Policy, or make it the server's."""

    code = "policy_pinned"


class NeedsVerifier(OnceError):
    """The action waits for a verifier of its kind, which this server has
    not."""

    code = "needs_verifier"


class NotClientVerified(OnceError):
    """A verifier asked for a kind the server's kinds file does not have
    verified by clients ("verifier": "client")."""

    code = "not_client_verified"


class NoSuchQuestion(OnceError):
    """A verifier's answer came after the question was given up on (its
    answer_within passed): it counted as cannot tell."""

    code = "no_such_question"


class TooLarge(OnceError):
    code = "too_large"


class ResultTooLarge(OnceError):
    code = "result_too_large"


_BY_CODE = {
    c.code: c
    for c in (
        InFlight, OutcomeUnknown, Review, AwaitingApproval, Fenced, Conflict, FingerprintMismatch, KeyMismatch,
        InvalidIntent, StoreUnavailable, NotRecorded, Unauthorized, Forbidden, BadRequest, NotFound,
        PolicyPinned, NeedsVerifier, NotClientVerified, NoSuchQuestion, TooLarge, ResultTooLarge,
    )
}


class ResultNotJSON(NotJSON):
    """The effect returned a result that is not JSON (path and reason say
    where and why). Its outcome was recorded unknown, for the kind's
    recovery to decide: the effect may have happened, and its result
    cannot be kept. status is what the server made of it."""

    def __init__(self, err, key, attempt, status):
        super().__init__(err.path, err.reason)
        self.key, self.attempt, self.status = key, attempt, status


class Failed(Exception):
    """The action failed for good: every duplicate is told so, and nothing
    runs. rejected_by and reason are set when a person rejected it."""

    def __init__(self, key, attempt, message, rejected_by="", reason=""):
        super().__init__(message or ("rejected by %s: %s" % (rejected_by, reason)))
        self.key, self.attempt, self.message = key, attempt, message
        self.rejected_by, self.reason = rejected_by, reason


class RetryLater(Exception):
    """Raised by an effect that did not happen and may be tried again."""


class Permanent(Exception):
    """Raised by an effect that did not happen and never will."""


# --- the policy a claim carries --------------------------------------------


@dataclasses.dataclass(frozen=True)
class Policy:
    """A kind's policy as a claim carries it (protocol Policy, a Go
    worker's Config): what the server applies to a kind it does not pin.
    Durations are seconds; zero (or "") is the server's default. lease is
    1 s to 1 h, max_execution 1 s to 24 h; recovery is "ask_person" or
    "retry_with_provider_key" (verify_then_decide is pinned by the
    server's kinds file). A pinned kind refuses a claim carrying another
    policy: PolicyPinned."""

    lease: float = 0
    max_execution: float = 0
    retention: float = 0
    recovery: str = ""

    def wire(self):
        w = {}
        for name in ("lease", "max_execution", "retention"):
            v = getattr(self, name)
            if v:
                w[name + "_ms"] = int(round(v * 1000))
        if self.recovery:
            w["recovery"] = self.recovery
        return w or None


# --- the intent ---------------------------------------------------------------


@dataclasses.dataclass
class Intent:
    """What an effect is: the run it belongs to, its step, its kind, whom
    it is aimed at, and its content. payload is a JSON value (JSON_NULL for
    null); raw, bytes; neither is no payload."""

    run: str
    step: int
    kind: str
    target: str = ""
    payload: object = None
    raw: bytes = None
    payload_in_key: bool = False

    def keys(self):
        """(key, fingerprint), computed here (KEYS.md)."""
        return key_of(self.run, self.step, self.kind, self.target, self.payload, self.payload_in_key, self.raw)

    def wire(self):
        w = {"run": self.run, "step": self.step, "kind": self.kind, "target": self.target, "payload_in_key": self.payload_in_key}
        if self.raw is not None:
            w["payload_base64"] = base64.b64encode(bytes(self.raw)).decode("ascii")
        elif self.payload is not None:
            w["payload"] = _Raw(payload_json(self.payload))
        return w


_MAX_ERROR_TEXT = 16 << 10


class _Raw:
    """JSON text sent as it is."""

    def __init__(self, text):
        self.text = text


def _encode(v):
    """v as JSON bytes, with _Raw values spliced in as they are."""
    raws = []

    def default(o):
        if isinstance(o, _Raw):
            raws.append(o.text)
            return "\x00raw%d\x00" % (len(raws) - 1)
        raise TypeError("cannot send %r" % (o,))

    text = json.dumps(v, default=default, ensure_ascii=False, allow_nan=False)
    for i, r in enumerate(raws):
        text = text.replace(json.dumps("\x00raw%d\x00" % i), r.decode("utf-8"), 1)
    return text.encode("utf-8")


def result_json(result):
    """result as the JSON text an outcome sends; NotJSON, naming the path
    from "result", for a part that is not JSON. An int beyond 2**53 is
    kept: the server stores the result's text as it is."""
    return payload_json(JSON_NULL if result is None else result, "result", exact_ints=False)


def _error_text(err, limit=_MAX_ERROR_TEXT):
    """err as an outcome's or a verdict's error: its text, or its type's
    name, cut to limit bytes of UTF-8 (the server keeps 16 KiB)."""
    t = str(err).strip() or type(err).__name__
    b = t.encode("utf-8")
    if len(b) > limit:
        t = b[: limit - 3].decode("utf-8", "ignore") + "..."
    return t


def write_token():
    """A fresh write token: 128 random bits."""
    return secrets.token_hex(16)


# --- the attempt -------------------------------------------------------------


class Attempt:
    """A claimed attempt: the only way to renew or settle its claim.

    stop is set when the claim cannot be renewed in time or its
    max_execution passed: the effect must stop then. time_left() says how
    long it has."""

    def __init__(self, client, answer, sent, policy=None):
        self.client = client
        self.policy = policy
        self.key = answer["key"]
        self.number = answer["attempt"]
        self.token = answer["token"]
        self.provider_key = answer.get("provider_key", "")
        self.heartbeat_every = answer.get("heartbeat_every_ms", 0) / 1000.0
        self._deadline = sent + answer.get("stop_after_ms", 0) / 1000.0
        hard = answer.get("max_execution_ms", 0)
        self._hard = sent + hard / 1000.0 if hard else None
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._settled = None

    def ref(self):
        r = {"key": self.key, "attempt": self.number, "token": self.token}
        p = self.policy.wire() if self.policy else None
        if p:
            r["policy"] = p  # a heartbeat renews the lease it says
        return r

    def deadline(self):
        """When the effect must have stopped, by time.monotonic."""
        with self._lock:
            d = self._deadline
        return min(d, self._hard) if self._hard else d

    def time_left(self):
        return max(0.0, self.deadline() - time.monotonic())

    def heartbeat(self):
        """Renew the claim. Raises Fenced when the attempt is over."""
        sent = time.monotonic()
        # Bounded by the lease, each try included: a heartbeat that
        # hangs past it renews nothing the effect could use.
        left = max(0.5, self.time_left())
        try:
            a = self.client._call("POST", "/v1/heartbeat", self.ref(), budget=left, timeout=left)
        except Fenced:
            self.stop.set()
            raise
        with self._lock:
            self._deadline = sent + a["stop_after_ms"] / 1000.0

    def _settle(self, outcome, **fields):
        body = dict(self.ref(), write=write_token(), outcome=outcome, **fields)
        a = self.client._call("POST", "/v1/outcome", body, budget=self.client.record_timeout)
        self._settled = a["status"]
        return a["status"]

    def succeed(self, result=None):
        """Record success with result (a JSON value); returns the status.
        A result that is not JSON raises NotJSON, naming its path, before
        anything is sent: the attempt is still held."""
        return self._settle("succeeded", result=_Raw(result_json(result)))

    def fail(self, error):
        """Record that the effect did not happen and never will."""
        return self._settle("permanent", error=_error_text(error))

    def release(self, error):
        """Record that the effect did not happen: the next claim runs it."""
        return self._settle("retry_later", error=_error_text(error))

    def unknown(self, error):
        """Record that the effect may have happened; the kind's recovery
        decides what that becomes."""
        return self._settle("unknown", error=_error_text(error))


# --- the client --------------------------------------------------------------


@dataclasses.dataclass
class Claimed:
    attempt: Attempt


@dataclasses.dataclass
class Replayed:
    key: str
    attempt: int
    result: object


class Client:
    """A client of one server. token is a worker's (or an operator's)
    bearer token; url the server's root, such as http://127.0.0.1:7070.

    A request whose reply is lost (the connection cut, the server
    restarting) is sent again, the same, for up to retry_for seconds:
    every write of the protocol answers the same when sent again.

    policies maps a kind to the Policy its claims carry (a Go worker's
    Config.Kinds); a claim given its own policy carries that instead."""

    def __init__(self, url, token, timeout=30.0, retry_for=10.0, record_timeout=30.0, check_keys=True, policies=None):
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.retry_for = retry_for
        self.record_timeout = record_timeout
        self.check_keys = check_keys
        self.policies = dict(policies or {})

    @classmethod
    def from_env(cls):
        """A client of $ONCE_URL with $ONCE_TOKEN."""
        return cls(os.environ["ONCE_URL"], os.environ["ONCE_TOKEN"])

    def _call(self, method, path, body=None, budget=None, timeout=None):
        data = None if body is None else _encode(body)
        # A request that waits must outlast its wait, or it is cut before
        # the server answers and sent again (waiting again).
        timeout = self.timeout if timeout is None else min(timeout, self.timeout)
        if isinstance(body, dict) and body.get("wait_ms"):
            timeout = max(timeout, body["wait_ms"] / 1000.0 + 10.0)
        end = time.monotonic() + (self.retry_for if budget is None else budget)
        wait = 0.05
        last = None
        while True:
            req = urllib.request.Request(self.url + path, data=data, method=method)
            req.add_header("Authorization", "Bearer " + self.token)
            if data is not None:
                req.add_header("Content-Type", "application/json")
            try:
                with urllib.request.urlopen(req, timeout=timeout) as resp:
                    return json.loads(resp.read())
            except urllib.error.HTTPError as e:
                raw = e.read()
                try:
                    problem = json.loads(raw)
                except ValueError:
                    problem = {"code": "", "detail": "HTTP %d: %r" % (e.code, raw[:200])}
                cls = _BY_CODE.get(problem.get("code"), OnceError)
                err = cls(problem, e.code)
                # Sent again, a write applies nothing twice: a 503 is
                # tried again while the budget lasts.
                if e.code != 503:
                    raise err from None
                last = err
            except (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError, OSError) as e:
                last = Unreachable({"code": "unreachable", "detail": "once: %s %s: %s" % (method, path, e)})
            if time.monotonic() + wait > end:
                raise last
            time.sleep(wait)
            wait = min(wait * 2, 1.0)

    def keys(self, intent):
        """The server's (key, fingerprint) of intent, checked against this
        client's."""
        body = {"intent": intent.wire()}
        if self.check_keys:
            body["key"], body["fingerprint"] = intent.keys()
        a = self._call("POST", "/v1/keys", body)
        return a["key"], a["fingerprint"]

    def claim(self, intent, wait=0.0, policy=None):
        """Claim intent: Claimed (run the effect, settle the attempt) or
        Replayed (it succeeded: here is its result); raises Failed for an
        action that failed for good, and an OnceError for the rest.
        policy (or the client's for the kind) is carried: PolicyPinned
        when the server pins the kind otherwise. A payload that is not
        JSON raises NotJSON, naming its path, before any request."""
        body = {"intent": intent.wire(), "write": write_token()}
        if wait:
            body["wait_ms"] = int(wait * 1000)
        if self.check_keys:
            body["key"], body["fingerprint"] = intent.keys()
        if policy is None:
            policy = self.policies.get(intent.kind)
        if policy is not None and policy.wire():
            body["policy"] = policy.wire()
        sent = time.monotonic()
        a = self._call("POST", "/v1/claim", body, budget=max(self.retry_for, wait + self.retry_for))
        if a["answer"] == "claimed":
            return Claimed(Attempt(self, a, sent, policy))
        if a["answer"] == "replayed":
            return Replayed(a["key"], a["attempt"], a.get("result"))
        raise Failed(a["key"], a["attempt"], a.get("message", ""), a.get("rejected_by", ""), a.get("reason", ""))

    def get(self, key):
        """The action as the server reads it (a dict)."""
        return self._call("GET", "/v1/actions/" + urllib.parse.quote(key, safe=""))

    def run(self, run_id):
        """A run whose steps are numbered 0, 1, 2... in the order do is
        called: a run resumed calls them again in the same order."""
        return Run(self, run_id)

    def verifier(self, kinds, fn, wait=20.0, max=10, stop=None):
        """A Verifier of kinds that answers with fn (see Verifier)."""
        return Verifier(self, kinds, fn, wait=wait, max=max, stop=stop)

    def verify(self, kinds, fn, stop, wait=20.0, max=10):
        """Answer the questions of kinds with fn until stop (a
        threading.Event) is set: Verifier.run."""
        self.verifier(kinds, fn, wait=wait, max=max, stop=stop).run()

    def verify_once(self, kinds, fn, wait=20.0, max=10):
        """Take at most one batch of questions of kinds, waiting up to wait
        seconds for the first, answer them with fn, and return how many
        answers the server received: Verifier.verify_once."""
        return self.verifier(kinds, fn, wait=wait, max=max).verify_once()


def do(client, intent, fn, wait=0.0, policy=None):
    """Run fn(attempt) once for intent, and return its result; a duplicate
    gets the stored result without running fn.

    fn raises RetryLater (it did not happen; a later claim runs it) or
    Permanent (it never will); any other exception leaves the outcome
    unknown, for the kind's recovery. While fn runs, a thread heartbeats the
    claim and sets attempt.stop when it cannot be renewed in time. The
    outcome is sent as soon as fn ends, whatever a heartbeat is doing.

    A result that is not JSON (a set, bytes, NaN, a dict key not a str...)
    is recorded as outcome unknown, with an error naming its path, and
    raises ResultNotJSON: the effect may have happened, and its result
    cannot be kept. policy is carried by the claim and its heartbeats
    (Client.claim)."""
    got = client.claim(intent, wait=wait, policy=policy)
    if isinstance(got, Replayed):
        return got.result
    a = got.attempt
    if a.time_left() <= 0:
        # The answer came after the lease was spent (a slow reply, a
        # pause): another worker may be taking the claim over, so the
        # effect does not start here; the claim is given back if still
        # ours.
        a.stop.set()
        try:
            a.release(RetryLater("the claim's answer came after its lease was spent; nothing was started"))
        except OnceError:
            pass
        raise LeaseSpent({"code": "lease_spent", "key": a.key, "attempt": a.number, "retry_after_ms": 1000,
                          "detail": "once: the claim of %s came back after its lease was spent; the effect was not started: deliver the job again" % a.key})
    done = threading.Event()

    def beat():
        while not done.wait(max(0.05, min(a.heartbeat_every, a.time_left() / 2))):
            if a.time_left() <= 0:
                a.stop.set()
                return
            try:
                a.heartbeat()
            except Fenced:
                return
            except OnceError:
                pass  # tried again at the next beat; time_left runs out meanwhile

    hb = threading.Thread(target=beat, name="once-heartbeat " + a.key[:12], daemon=True)
    hb.start()
    # The outcome goes out as soon as fn ends: the heartbeat thread is
    # told to stop, not waited for (a heartbeat stuck on the network
    # would hold the outcome back past the lease, and another worker
    # would take the claim over).
    try:
        result = fn(a)
    except RetryLater as e:
        done.set()
        a.release(e)
        raise
    except Permanent as e:
        done.set()
        a.fail(e)
        raise
    except BaseException as e:
        done.set()
        a.unknown(e)
        raise
    finally:
        done.set()
    try:
        text = result_json(result)
    except NotJSON as e:
        status = a.unknown(e)
        raise ResultNotJSON(e, a.key, a.number, status) from None
    a._settle("succeeded", result=_Raw(text))
    return result


class Run:
    """The steps of one run, numbered in order."""

    def __init__(self, client, run_id):
        self.client, self.id, self.next = client, run_id, 0

    def do(self, kind, fn, target="", payload=None, raw=None, payload_in_key=False, wait=0.0, policy=None):
        step = self.next
        self.next += 1
        return do(self.client, Intent(self.id, step, kind, target, payload, raw, payload_in_key), fn, wait=wait, policy=policy)


def dispose(err):
    """What a queue consumer does with a job whose do raised err: ("ack",
    0) when nothing is left to do, ("retry", seconds) to deliver it again
    later, ("drop", 0) when no delivery can change it (a person or a new
    intent must)."""
    if err is None or isinstance(err, Failed):
        return ("ack", 0)
    if isinstance(err, (InFlight, OutcomeUnknown, AwaitingApproval, StoreUnavailable, NotRecorded, Unreachable, LeaseSpent,
                        NeedsVerifier)):
        return ("retry", max(err.retry_after, 1.0))
    if isinstance(err, RetryLater):
        return ("retry", 1.0)
    if isinstance(err, (Review, FingerprintMismatch, InvalidIntent, KeyMismatch, Permanent, BadRequest, Fenced, Conflict,
                        PolicyPinned, NotJSON)):
        return ("drop", 0)
    return ("retry", 5.0)


# --- verifying from a client ----------------------------------------------


@dataclasses.dataclass
class Question:
    """A question a verifier answers: did attempt's effect land at the
    provider? Ask the provider by provider_key. payload is the intent's
    JSON payload (None when it had none), raw its bytes when not JSON;
    note what the effect noted, or why its outcome is unknown."""

    id: str
    key: str
    attempt: int
    kind: str
    run: str
    step: int
    target: str
    provider_key: str
    payload: object
    raw: bytes
    note: str
    answer_within: float  # seconds from the take's sending; 0: no end
    _deadline: float = None

    @classmethod
    def _of(cls, q, sent):
        within = q.get("answer_within_ms", 0) / 1000.0
        raw = base64.b64decode(q["payload_base64"]) if q.get("payload_base64") else None
        return cls(q["question"], q["key"], q["attempt"], q["kind"], q.get("run", ""), q.get("step", 0), q.get("target", ""),
                   q.get("provider_key", ""), q.get("payload"), raw, q.get("note", ""), within,
                   sent + within if within else None)

    def time_left(self):
        """How long an answer is still taken, by time.monotonic; None when
        it has no end."""
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())


@dataclasses.dataclass(frozen=True)
class Landed:
    """The effect landed: result is what the provider shows of it (a JSON
    value), kept as the action's result."""

    result: object = None


@dataclasses.dataclass(frozen=True)
class NotLanded:
    """The effect did not land: the action is run again."""


@dataclasses.dataclass(frozen=True)
class CannotTell:
    """The provider could not say: asked again later, then review."""

    error: str


def landed(result=None):
    return Landed(result)


def not_landed():
    return NotLanded()


def cannot_tell(error):
    return CannotTell(_error_text(error))


class Verifier:
    """A client verifier of kinds (docs/protocol.md, Verifying from a
    client): it long-polls POST /v1/verify/take for their questions, asks
    fn(question) whether each effect landed, and answers POST
    /v1/verify/answer.

    fn returns landed(result), not_landed() or cannot_tell(error). An
    exception raised by fn, a result that is not JSON, or a return that is
    none of the three is answered cannot_tell with its text (bounded), so
    the action is asked again later, never decided blind. An answer whose
    reply is lost is sent again, the same (the same question id). An
    answer that came too late (NoSuchQuestion) is logged and not counted.

    run() loops until stop (a threading.Event) is set: it ends after the
    take in progress, within wait seconds, once the questions taken are
    answered. verify_once() handles at most one batch."""

    def __init__(self, client, kinds, fn, wait=20.0, max=10, stop=None):
        if isinstance(kinds, str):
            kinds = [kinds]
        self.client, self.kinds, self.fn = client, list(kinds), fn
        self.wait, self.max = wait, max
        self.stop = stop or threading.Event()

    def verdict(self, q):
        """fn's verdict on q, as the body of its answer."""
        try:
            v = self.fn(q)
        except Exception as e:  # noqa: BLE001 - every error is a cannot_tell
            v = CannotTell(_error_text("the verifier raised %s: %s" % (type(e).__name__, e)))
        body = {"question": q.id}
        if isinstance(v, Landed):
            try:
                body.update(verdict="landed", result=_Raw(result_json(v.result)))
                return body
            except NotJSON as e:
                v = CannotTell(_error_text("the verifier's result is not JSON: %s" % e))
        if isinstance(v, NotLanded):
            body["verdict"] = "not_landed"
        elif isinstance(v, CannotTell):
            body.update(verdict="cannot_tell", error=_error_text(v.error or "cannot tell"))
        else:
            body.update(verdict="cannot_tell", error=_error_text("the verifier returned %r, not landed(), not_landed() or cannot_tell()" % (v,)))
        return body

    def verify_once(self):
        """Take one batch (waiting up to wait seconds for its first
        question), answer each, and return how many answers were
        received."""
        body = {"kinds": self.kinds, "wait_ms": int(self.wait * 1000), "max": self.max}
        sent = time.monotonic()
        got = self.client._call("POST", "/v1/verify/take", body)
        answered = 0
        for raw in got.get("questions") or []:
            q = Question._of(raw, sent)
            if q.time_left() == 0:
                log.warning("once: question %s about attempt %d of %s came too late to answer", q.id, q.attempt, q.key)
                continue
            answer = self.verdict(q)
            try:
                # Sent again on a lost reply: the same question id, the
                # same verdict, answered received again.
                self.client._call("POST", "/v1/verify/answer", answer, budget=max(q.time_left() or 0, self.client.retry_for))
            except (NoSuchQuestion, Conflict, Unreachable, StoreUnavailable) as e:
                # Too late (it counted as cannot tell), or lost: the
                # action is asked about again; the rest are answered.
                log.warning("once: the answer to question %s about attempt %d of %s was not received: %s", q.id, q.attempt, q.key, e)
                continue
            answered += 1
        return answered

    def run(self):
        """Answer questions until stop is set. The server not answering is
        waited out; an error that asking again cannot change
        (Unauthorized, NotClientVerified, BadRequest...) is raised."""
        backoff = 0.1
        while not self.stop.is_set():
            try:
                self.verify_once()
                backoff = 0.1
            except (Unreachable, StoreUnavailable, NotRecorded) as e:
                log.warning("once: verifier of %s: %s", ",".join(self.kinds), e)
                self.stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
