"""A worker process of the shared scenarios (clients/scenarios.json).

lab/cli/scenarios_test.go starts it with the job in $ONCE_SCENARIO_JOB
(JSON: the server's and the provider's URLs, the intent, where to hold)
and reads what it does from its stdout, one JSON object a line, to know
when to kill or stop it. A line on stdin lets a held effect go on.

role "do" runs the intent through once_client.do, redelivering the job as
a queue would while dispose says retry; the effect creates a customer at
the provider with the attempt's provider key. role "verify" is a client
verifier (once_client.Verifier) that asks the provider whether the
attempt's provider key landed.
"""

import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from once_client import (  # noqa: E402
    Client,
    Failed,
    Intent,
    OnceError,
    Permanent,
    RetryLater,
    Verifier,
    cannot_tell,
    dispose,
    do,
    landed,
    not_landed,
)


def emit(**event):
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def provider(job, method, path, body=None, key=""):
    """(status, JSON answer) of a request to the provider."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(job["provider"] + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Idempotency-Key", key)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, None


def code_of(e):
    if isinstance(e, OnceError):
        return e.code or e.problem.get("code") or "error"
    if isinstance(e, RetryLater):
        return "retry_later"
    if isinstance(e, Permanent):
        return "permanent"
    if isinstance(e, Failed):
        return "failed"
    return "error:" + type(e).__name__


def run_do(job, client):
    i = job["intent"]
    intent = Intent(i["run"], i["step"], i["kind"], i["target"], i.get("payload"))
    held = [False]

    def hold(at):
        if job.get("hold") == at and not held[0]:
            held[0] = True
            emit(event="held", at=at)
            sys.stdin.readline()

    def effect(a):
        emit(event="effect", phase="started", attempt=a.number, provider_key=a.provider_key)
        hold("started")
        status, body = provider(job, "POST", "/v1/customers", {"email": i["target"], "name": i["run"]}, a.provider_key)
        if status in (429, 503):
            raise RetryLater("the provider answered %d" % status)
        if status != 200:
            raise RuntimeError("the provider answered %d" % status)
        emit(event="effect", phase="landed", attempt=a.number, id=body["id"])
        hold("landed")
        return body["id"]

    end = time.monotonic() + job.get("redeliver_ms", 0) / 1000.0
    while True:
        try:
            result = do(client, intent, effect)
        except Exception as e:  # noqa: BLE001 - every error is reported
            action, after = dispose(e)
            if action == "retry" and time.monotonic() < end:
                emit(event="redeliver", code=code_of(e), after_ms=int(after * 1000))
                time.sleep(min(after, 0.5))
                continue
            emit(event="end", outcome="error", code=code_of(e), detail=str(e))
            return 0
        emit(event="end", outcome="result", result=result)
        return 0


def run_verify(job, client):
    end = time.monotonic() + job.get("verify_for_ms", 30000) / 1000.0
    answered = 0

    def ask(q):
        emit(event="question", key=q.key, attempt=q.attempt)
        status, body = provider(job, "GET", "/scenario/landed/" + urllib.parse.quote(q.provider_key, safe=""))
        if status == 200:
            v = landed(body["id"])
        elif status == 404:
            v = not_landed()
        else:
            v = cannot_tell("the provider answered %d" % status)
        verdicts.append(type(v).__name__)
        return v

    names = {"Landed": "landed", "NotLanded": "not_landed", "CannotTell": "cannot_tell"}
    verifier = Verifier(client, job["verify_kinds"], ask, wait=2.0, max=1)
    while answered < job.get("questions", 1) and time.monotonic() < end:
        verdicts = []
        n = verifier.verify_once()
        for v in verdicts[:n]:
            emit(event="verified", verdict=names[v])
        answered += n
    emit(event="end", outcome="verified" if answered else "no_question")
    return 0


def main():
    job = json.loads(os.environ["ONCE_SCENARIO_JOB"])
    client = Client(job["url"], job["token"])
    emit(event="ready", lang="python", name=job["name"])
    if job["role"] == "verify":
        return run_verify(job, client)
    return run_do(job, client)


if __name__ == "__main__":
    sys.exit(main())
