"""An agent run of five tool calls whose every effect happens once, however
often the run is killed and resumed.

A scripted model (no network, no weights: a fixed plan) drives an
OpenAI-style tool loop: each turn it answers with one tool call, under a
tool-call id it makes up afresh every turn, as a real model does. The loop
runs each call through once's protocol, keyed by the run's id and the
call's step number in the run (once_client's Run), never by that id:

    step 0  send_email   ada@example.com        the order was received
    step 1  send_email   warehouse@example.com  reserve the stock
    step 2  send_email   ada@example.com        the card is charged next
    step 3  charge_card  the customer           42.00 EUR at the provider
    step 4  send_email   ada@example.com        the receipt, with step 3's charge id

The emails go to an SMTP server (smtplib); each carries a Message-ID made
from its action's key, so every attempt of a step sends the same one. The
charge goes to a payment provider over HTTP with the attempt's
provider_key as its Idempotency-Key. The server's kinds file (kinds.json)
says what a killed step becomes: send_email is verify_then_decide, and
this process is its verifier (it searches the mail provider for the
Message-ID); charge_card is retry_with_provider_key.

Usage (ONCE_URL and ONCE_TOKEN name the once server and a worker token):

    python3 agent.py --run order-42 --customer cus_1 \\
        [--smtp 127.0.0.1:2525] [--provider http://127.0.0.1:8025] \\
        [--mailbox http://127.0.0.1:8026] [--key-by step|tool-call-id]

KILL_AT=STEP:PHASE makes the process SIGKILL itself at that point, for the
tests and for trying it by hand: PHASE is before (the step boundary; step
5 is after the last call), claimed, mid (half of the message or the
request sent), sent (all of it sent, the reply not read) or replied (the
reply read, the outcome not recorded).

Exit status: 0 the run finished; 3 a step waits for a person; 75 a step is
held or undecided for now: run it again; 2 bad usage; 1 any other error.
"""

import argparse
import email.message
import email.utils
import http.client
import json
import os
import secrets
import signal
import smtplib
import socket
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request

import once_client
from once_client import Intent, OnceError, Permanent, RetryLater

# The order the run takes. A real agent has it from its conversation;
# what matters is that a resumed run sees the same one.
ORDER = {"customer_email": "ada@example.com", "warehouse": "warehouse@example.com",
         "item": "2 x enamel mug", "amount": 4200, "currency": "eur", "sender": "shop@example.com"}

# How long a step's claim waits for another attempt of it: a killed run's
# claim holds until its lease (kinds.json) runs out, then recovery decides.
CLAIM_WAIT = 30.0

PHASES = ("before", "claimed", "mid", "sent", "replied")


def say(*parts):
    print(*parts, flush=True)


# --- the model -----------------------------------------------------------------


class ScriptedModel:
    """Stands in for the LLM: given the conversation so far, the next
    assistant message, in the chat-completions shape. Its plan is fixed,
    and it reads earlier tool results (the charge's id) from the
    conversation, as a model does. Its tool-call ids are random, new on
    every turn: a resumed run sees other ids for the same calls."""

    def __init__(self, run_id, customer):
        self.run_id, self.customer = run_id, customer

    def respond(self, messages):
        results = [json.loads(m["content"]) for m in messages if m["role"] == "tool"]
        calls = self.plan(results)
        if len(results) == len(calls):
            return {"role": "assistant", "content": "Order %s is paid and confirmed; the customer has a receipt." % self.run_id}
        name, args = calls[len(results)]
        return {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_" + secrets.token_hex(6), "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)},
        }]}

    def plan(self, results):
        o, r = ORDER, self.run_id
        money = "%d.%02d %s" % (o["amount"] // 100, o["amount"] % 100, o["currency"].upper())
        charge = results[3]["id"] if len(results) > 3 else None

        def mail(to, subject, body):
            return ("send_email", {"from": o["sender"], "to": to, "subject": subject, "body": body})

        return [
            mail(o["customer_email"], "Order %s: received" % r,
                 "We received your order %s: %s, %s.\n" % (r, o["item"], money)),
            mail(o["warehouse"], "Order %s: reserve stock" % r, "Reserve %s for order %s.\n" % (o["item"], r)),
            mail(o["customer_email"], "Order %s: your card is charged next" % r,
                 "Your %s are reserved; we charge %s to your card now.\n" % (o["item"], money)),
            ("charge_card", {"customer": self.customer, "amount": o["amount"], "currency": o["currency"],
                             "description": "order " + r}),
            mail(o["customer_email"], "Order %s: receipt" % r, "We charged %s (charge %s). Thank you.\n" % (money, charge)),
        ]


# --- the agent -----------------------------------------------------------------


class Agent:
    def __init__(self, opts, client):
        self.opts, self.client = opts, client
        self.run = client.run(opts.run)
        self.step = 0  # the tool calls made so far: the next call's step number
        self.kill_at = None
        if os.environ.get("KILL_AT"):
            s, _, phase = os.environ["KILL_AT"].partition(":")
            if not s.isdigit() or phase not in PHASES:
                print("agent: KILL_AT=%r; give STEP:PHASE, PHASE one of %s" % (os.environ["KILL_AT"], ", ".join(PHASES)), file=sys.stderr)
                raise SystemExit(2)
            self.kill_at = (int(s), phase)

    def die_at(self, step, phase):
        """SIGKILL this process if KILL_AT names this point: a real kill,
        with no chance to record anything."""
        if self.kill_at == (step, phase):
            say("kill: %d:%s (SIGKILL)" % (step, phase))
            os.kill(os.getpid(), signal.SIGKILL)

    def loop(self, model):
        """The tool loop: ask the model, run the tool calls it answers
        with, hand their results back, until it answers without one."""
        messages = [
            {"role": "system", "content": "You take orders: email the customer and the warehouse, charge the card."},
            {"role": "user", "content": "Take order %s for customer %s." % (self.opts.run, self.opts.customer)},
        ]
        while True:
            reply = model.respond(messages)
            messages.append(reply)
            if not reply.get("tool_calls"):
                self.die_at(self.step, "before")
                return reply["content"]
            for call in reply["tool_calls"]:
                result = self.tool(call)
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)})

    def tool(self, call):
        """Runs one tool call once. Its key is the run and the step, with
        the kind and the target: the arguments are its fingerprint, so a
        resumed run that asks for something else at this step is refused,
        not run. The tool-call id is only printed."""
        name, args = call["function"]["name"], json.loads(call["function"]["arguments"])
        step = self.step
        self.step += 1
        self.die_at(step, "before")
        effect, target = {"send_email": (self.send_email, args.get("to", "")),
                          "charge_card": (self.charge_card, args.get("customer", ""))}[name]
        ran = []

        def fn(attempt):
            ran.append(attempt.number)
            self.die_at(step, "claimed")
            return effect(step, attempt, args)

        if self.opts.key_by == "tool-call-id":
            # The counterexample: a key made from the model's id. A resumed
            # run's call has another id, so another key, and runs again.
            result = once_client.do(self.client, Intent(call["id"], 0, name, target, args), fn, wait=CLAIM_WAIT)
            key = Intent(call["id"], 0, name, target, args).keys()[0]
        else:
            result = self.run.do(name, fn, target=target, payload=args, wait=CLAIM_WAIT)
            key = Intent(self.opts.run, step, name, target, args).keys()[0]
        how = "ran" if ran else "replayed"
        if ran and ran[0] > 1:
            how = "ran (attempt %d)" % ran[0]
        say("step %d  %-11s  %-22s %-17s key %s  %s  %s" % (step, name, target, how, key[:12], call["id"], summary(result)))
        return result

    # --- the effects ---

    def send_email(self, step, attempt, args):
        """Sends one message over SMTP. Its Message-ID is made from the
        action's key, the same on every attempt, so the verifier can ask
        the mail provider whether it arrived. Errors before the final dot
        mean nothing was delivered (RetryLater, or Permanent for a 5xx);
        an error after it leaves the outcome unknown."""
        msg = email.message.EmailMessage()
        msg["From"], msg["To"], msg["Subject"] = args["from"], args["to"], args["subject"]
        msg["Message-ID"] = message_id(attempt.key)
        msg["Date"] = email.utils.formatdate()
        msg.set_content(args["body"])
        data = dot_stuffed(msg.as_bytes())
        host, _, port = self.opts.smtp.rpartition(":")
        try:
            s = smtplib.SMTP(host, int(port), timeout=max(1.0, attempt.time_left()))
            for cmd, want in (("ehlo " + socket.gethostname(), 250), ("mail FROM:<%s>" % args["from"], 250),
                              ("rcpt TO:<%s>" % args["to"], 250), ("data", 354)):
                code, text = s.docmd(cmd)
                if code != want:
                    err = "the server answered %r with %d %s" % (cmd, code, text.decode(errors="replace"))
                    raise Permanent(err) if code >= 500 else RetryLater(err)
            s.send(data[:len(data) // 2])
            self.die_at(step, "mid")
            s.send(data[len(data) // 2:] + b".\r\n")
        except (OSError, smtplib.SMTPException) as e:
            raise RetryLater("the message was not sent whole: %s" % e) from None
        # The message is on its way: from here on, only the reply says.
        self.die_at(step, "sent")
        code, text = s.getreply()  # raises when the reply is lost: unknown
        self.die_at(step, "replied")
        try:
            s.quit()
        except (OSError, smtplib.SMTPException):
            pass
        reply = "%d %s" % (code, text.decode(errors="replace"))
        if code >= 500:
            raise Permanent("the server refused the message: " + reply)
        if code >= 400:
            raise RetryLater("the server did not take the message: " + reply)
        return {"message_id": message_id(attempt.key), "reply": reply}

    def charge_card(self, step, attempt, args):
        """Charges the card at the provider, with the attempt's
        provider_key as Idempotency-Key: the same on every attempt of the
        step, so a retried charge is answered from the provider's store."""
        body = json.dumps({k: args[k] for k in ("customer", "amount", "currency")}).encode()
        u = urllib.parse.urlsplit(self.opts.provider)
        try:
            c = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=max(1.0, attempt.time_left()))
            c.putrequest("POST", "/v1/charges")
            for k, v in (("Idempotency-Key", attempt.provider_key), ("Content-Type", "application/json"),
                         ("Content-Length", str(len(body)))):
                c.putheader(k, v)
            c.endheaders()
            c.send(body[:len(body) // 2])
            self.die_at(step, "mid")
            c.send(body[len(body) // 2:])
        except OSError as e:
            raise RetryLater("the request was not sent whole: %s" % e) from None
        self.die_at(step, "sent")
        resp = c.getresponse()  # raises when the answer is lost: unknown
        answer = resp.read()
        self.die_at(step, "replied")
        c.close()
        if resp.status == 409:
            # A request with this key is still being answered: nothing new
            # was made by this one; the same call goes again.
            raise RetryLater("the provider is still answering this key (409)")
        if 400 <= resp.status < 500:
            raise Permanent("the provider refused the charge: %d %s" % (resp.status, answer[:200]))
        if resp.status != 200:
            raise Exception("the provider answered %d: the charge may have been made" % resp.status)
        charge = json.loads(answer)
        return {"id": charge["id"], "amount": charge["amount"], "replayed": resp.getheader("Idempotent-Replayed") == "true"}


def message_id(key):
    return "<%s@once>" % key


def dot_stuffed(raw):
    """raw as SMTP's DATA carries it: CRLF lines, a leading dot doubled,
    ending with CRLF (the final dot follows)."""
    lines = raw.replace(b"\r\n", b"\n").split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return b"".join((b"." + ln if ln.startswith(b".") else ln) + b"\r\n" for ln in lines)


def summary(result):
    if isinstance(result, dict) and "id" in result:
        return result["id"] + (" (answered from the provider's idempotency store)" if result.get("replayed") else "")
    if isinstance(result, dict):
        return result.get("reply") or result.get("found") or json.dumps(result)
    return json.dumps(result)


# --- the verifier ----------------------------------------------------------------


class Verifier(threading.Thread):
    """The send_email kind's verifier (kinds.json: verify_then_decide,
    "verifier": "client"). When recovery meets a dead claim of the kind,
    the server asks; this thread takes the question (POST
    /v1/verify/take), searches the mail provider for the Message-ID the
    attempt sent, and answers: landed (found), not_landed (not there), or
    cannot_tell (the search failed). once_client has no verifier calls, so
    these are the protocol's two routes, spoken directly."""

    def __init__(self, client, mailbox):
        super().__init__(name="once-verifier", daemon=True)
        self.client, self.mailbox = client, mailbox.rstrip("/")
        self.ready = threading.Event()

    def post(self, path, body, timeout):
        req = urllib.request.Request(self.client.url + path, data=json.dumps(body).encode(), method="POST")
        req.add_header("Authorization", "Bearer " + self.client.token)
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as e:
            try:
                problem = json.loads(e.read())
            except ValueError:
                problem = {}
            raise OnceError(problem, e.code) from None

    def run(self):
        while True:
            try:
                got = self.post("/v1/verify/take", {"kinds": ["send_email"], "wait_ms": 5000, "max": 10}, 20)
            except OnceError as e:
                if e.problem.get("code") == "not_client_verified":
                    say("verify: the server does not ask clients to verify send_email (its kinds file): %s" % e)
                    return
                threading.Event().wait(1)
                continue
            except OSError:
                threading.Event().wait(1)
                continue
            for q in got.get("questions", []):
                self.answer(q)

    def answer(self, q):
        mid = message_id(q["key"])
        try:
            url = self.mailbox + "/messages?" + urllib.parse.urlencode({"message_id": mid})
            with urllib.request.urlopen(url, timeout=5) as resp:
                found = json.loads(resp.read()).get("messages", [])
        except (OSError, ValueError) as e:
            verdict = {"verdict": "cannot_tell", "error": "the mail provider's search failed: %s" % e}
        else:
            if found:
                verdict = {"verdict": "landed", "result": {"message_id": mid, "found": "found in the mailbox"}}
            else:
                verdict = {"verdict": "not_landed"}
        say("verify: step %s send_email attempt %s, Message-ID %s...: %s" % (q["step"], q["attempt"], mid[:13], verdict["verdict"]))
        try:
            self.post("/v1/verify/answer", dict(verdict, question=q["question"]), 10)
        except (OnceError, OSError) as e:
            say("verify: the answer was not received: %s; the question is asked again" % e)


# --- main ---------------------------------------------------------------------------


def main(argv):
    p = argparse.ArgumentParser(prog="agent.py", description="An agent run of five tool calls, each effect once.")
    p.add_argument("--run", required=True, help="the run's id; the same id resumes it")
    p.add_argument("--customer", required=True, help="the provider's customer to charge, such as cus_1")
    p.add_argument("--smtp", default="127.0.0.1:2525", help="the SMTP server, HOST:PORT")
    p.add_argument("--provider", default="http://127.0.0.1:8025", help="the payment provider's URL")
    p.add_argument("--mailbox", default="http://127.0.0.1:8026", help="the mail provider's search API, for the verifier")
    p.add_argument("--key-by", choices=("step", "tool-call-id"), default="step",
                   help="key tool calls by run and step (right) or by the model's tool-call id (the counterexample)")
    opts = p.parse_args(argv)
    # Checked here: a flag that is wrong must not surface inside an
    # effect, where any error means its outcome is unknown.
    host, _, port = opts.smtp.rpartition(":")
    if not host or not port.isdigit():
        p.error("--smtp %r is not HOST:PORT" % opts.smtp)
    for flag, url in (("--provider", opts.provider), ("--mailbox", opts.mailbox)):
        u = urllib.parse.urlsplit(url)
        if u.scheme != "http" or not u.hostname:
            p.error("%s %r is not an http:// URL" % (flag, url))
    if not os.environ.get("ONCE_URL") or not os.environ.get("ONCE_TOKEN"):
        print("agent: set ONCE_URL (the once server) and ONCE_TOKEN (a worker token)", file=sys.stderr)
        return 2
    client = once_client.Client.from_env()
    agent = Agent(opts, client)
    Verifier(client, opts.mailbox).start()
    say("run %s: once %s, smtp %s, provider %s, keyed by %s" % (opts.run, client.url, opts.smtp, opts.provider, opts.key_by))
    try:
        final = agent.loop(ScriptedModel(opts.run, opts.customer))
    except Exception as e:  # noqa: BLE001 -- every error ends the run; dispose says how
        what, _ = once_client.dispose(e)
        if isinstance(e, once_client.Review):
            say("run %s stopped: step %d waits for a person: %s" % (opts.run, agent.step - 1, e))
            return 3
        if what == "retry":
            say("run %s stopped: step %d is not done yet (%s: %s): run it again" % (opts.run, agent.step - 1, type(e).__name__, e))
            return 75
        say("run %s failed at step %d: %s: %s" % (opts.run, agent.step - 1, type(e).__name__, e))
        return 1
    say("run %s finished: %d steps. %s" % (opts.run, agent.step, final))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
