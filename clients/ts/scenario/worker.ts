// A worker process of the shared scenarios (clients/scenarios.json).
//
// lab/cli/scenarios_test.go starts it with the job in $ONCE_SCENARIO_JOB
// (JSON: the server's and the provider's URLs, the intent, where to hold)
// and reads what it does from its stdout, one JSON object a line, to know
// when to kill or stop it. A line on stdin lets a held effect go on.
//
// role "do" runs the intent through Client.do, redelivering the job as a
// queue would while dispose says retry; the effect creates a customer at
// the provider with the attempt's provider key. role "verify" is a client
// verifier (Verifier) that asks the provider whether the key landed.
import { createInterface } from "node:readline";
import { Client, Failed, OnceError, Permanent, RetryLater, Verifier, cannotTell, dispose, landed, notLanded, type Attempt, type Question, type Verdict } from "../src/index.js";

interface Job {
  name: string;
  role: "do" | "verify";
  url: string;
  token: string;
  provider: string;
  intent: { run: string; step: number; kind: string; target: string; payload?: unknown };
  hold?: "" | "started" | "landed";
  redeliver_ms?: number;
  verify_kinds?: string[];
  verify_for_ms?: number;
  questions?: number;
}

const emit = (event: Record<string, unknown>) => process.stdout.write(JSON.stringify(event) + "\n");
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

// Lines from stdin, each resolving the oldest wait for one.
const lines: string[] = [];
const waiting: ((l: string) => void)[] = [];
createInterface({ input: process.stdin }).on("line", (l) => {
  const w = waiting.shift();
  if (w) w(l);
  else lines.push(l);
});
const nextLine = () => new Promise<string>((r) => (lines.length > 0 ? r(lines.shift()!) : waiting.push(r)));

async function provider(job: Job, method: string, path: string, body?: unknown, key = ""): Promise<[number, { id: string } | undefined]> {
  const headers: Record<string, string> = {};
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (key) headers["Idempotency-Key"] = key;
  const resp = await fetch(job.provider + path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body), signal: AbortSignal.timeout(30_000) });
  const text = await resp.text();
  return [resp.status, resp.ok ? (JSON.parse(text) as { id: string }) : undefined];
}

function codeOf(e: unknown): string {
  if (e instanceof OnceError) return e.code || "error";
  if (e instanceof RetryLater) return "retry_later";
  if (e instanceof Permanent) return "permanent";
  if (e instanceof Failed) return "failed";
  return "error:" + (e instanceof Error ? e.name : typeof e);
}

async function runDo(job: Job, client: Client): Promise<void> {
  const i = job.intent;
  let held = false;
  const hold = async (at: string) => {
    if (job.hold === at && !held) {
      held = true;
      emit({ event: "held", at });
      await nextLine();
    }
  };
  const effect = async (a: Attempt): Promise<string> => {
    emit({ event: "effect", phase: "started", attempt: a.number, provider_key: a.providerKey });
    await hold("started");
    const [status, body] = await provider(job, "POST", "/v1/customers", { email: i.target, name: i.run }, a.providerKey);
    if (status === 429 || status === 503) throw new RetryLater(`the provider answered ${status}`);
    if (status !== 200 || !body) throw new Error(`the provider answered ${status}`);
    emit({ event: "effect", phase: "landed", attempt: a.number, id: body.id });
    await hold("landed");
    return body.id;
  };
  const end = performance.now() + (job.redeliver_ms ?? 0);
  const intent = { run: i.run, step: i.step, kind: i.kind, target: i.target, payload: i.payload === undefined ? undefined : { json: i.payload } };
  for (;;) {
    try {
      const result = await client.do(intent, effect);
      emit({ event: "end", outcome: "result", result });
      return;
    } catch (e) {
      const d = dispose(e);
      if (d.action === "retry" && performance.now() < end) {
        emit({ event: "redeliver", code: codeOf(e), after_ms: d.afterMs });
        await sleep(Math.min(d.afterMs, 500));
        continue;
      }
      emit({ event: "end", outcome: "error", code: codeOf(e), detail: e instanceof Error ? e.message : String(e) });
      return;
    }
  }
}

async function runVerify(job: Job, client: Client): Promise<void> {
  const end = performance.now() + (job.verify_for_ms ?? 30_000);
  let answered = 0;
  let verdicts: string[] = [];
  const ask = async (q: Question): Promise<Verdict> => {
    emit({ event: "question", key: q.key, attempt: q.attempt });
    const [status, body] = await provider(job, "GET", "/scenario/landed/" + encodeURIComponent(q.providerKey));
    const v = status === 200 && body ? landed(body.id) : status === 404 ? notLanded() : cannotTell(`the provider answered ${status}`);
    verdicts.push(v.verdict);
    return v;
  };
  const verifier = new Verifier(client, job.verify_kinds ?? [], ask, { waitMs: 2000, max: 1 });
  while (answered < (job.questions ?? 1) && performance.now() < end) {
    verdicts = [];
    const n = await verifier.verifyOnce();
    for (const v of verdicts.slice(0, n)) emit({ event: "verified", verdict: v });
    answered += n;
  }
  emit({ event: "end", outcome: answered > 0 ? "verified" : "no_question" });
}

async function main() {
  const job = JSON.parse(process.env.ONCE_SCENARIO_JOB ?? "") as Job;
  const client = new Client(job.url, job.token);
  emit({ event: "ready", lang: "ts", name: job.name });
  if (job.role === "verify") await runVerify(job, client);
  else await runDo(job, client);
  process.exit(0);
}

main().catch((e) => {
  process.stderr.write(`scenario worker: ${e instanceof Error ? e.stack : String(e)}\n`);
  process.exit(1);
});
