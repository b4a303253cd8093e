#!/usr/bin/env node
// call.mjs calls one MCP tool with either TypeScript SDK, so the tests of
// once mcp can see what real hosts see.
//
//   node call.mjs --sdk new|old (--stdio "CMD ARGS" | --http URL)
//     --tool NAME [--args JSON] [--meta JSON] [--repeat N] [--concurrent N]
//     [--progress] [--timeout MS] [--negotiate auto|legacy|VERSION] [--list]
//
// --sdk new is @modelcontextprotocol/client 2.x (protocol 2026-07-28 when
// the server offers it); --sdk old is @modelcontextprotocol/sdk 1.x
// (2025-11-25 at most). Calls go out in --repeat rounds of --concurrent
// calls each, on one connection.
//
// Stdout is JSON lines: first {"connected": {sdk, protocolVersion,
// server}}, then {"progress": {...}} as it arrives with --progress, and
// one {"ok": true, "result": ...} or {"error": {...}} per call. A tool
// error (isError) is ok: the call worked and the tool said no. The exit
// code is 0 if every call was ok, 1 if one failed, 2 if it never got
// that far.

const opts = parse(process.argv.slice(2));

function parse(argv) {
  const o = { sdk: 'new', args: {}, repeat: 1, concurrent: 1, timeout: 600000, negotiate: 'auto' };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const val = () => {
      if (i + 1 >= argv.length) usage(`${a} needs a value`);
      return argv[++i];
    };
    switch (a) {
      case '--sdk': o.sdk = val(); break;
      case '--stdio': o.stdio = val(); break;
      case '--http': o.http = val(); break;
      case '--tool': o.tool = val(); break;
      case '--args': o.args = JSON.parse(val()); break;
      case '--meta': o.meta = JSON.parse(val()); break;
      case '--repeat': o.repeat = Number(val()); break;
      case '--concurrent': o.concurrent = Number(val()); break;
      case '--timeout': o.timeout = Number(val()); break;
      case '--negotiate': o.negotiate = val(); break;
      case '--progress': o.progress = true; break;
      case '--list': o.list = true; break;
      default: usage(`unknown argument ${a}`);
    }
  }
  if (o.sdk !== 'new' && o.sdk !== 'old') usage('--sdk is new or old');
  if (!o.stdio === !o.http) usage('give one of --stdio and --http');
  if (!o.tool && !o.list) usage('give --tool or --list');
  return o;
}

function usage(msg) {
  out({ error: { message: `usage: ${msg}` } });
  process.exit(2);
}

function out(v) {
  process.stdout.write(JSON.stringify(v) + '\n');
}

// words splits a command line on spaces, keeping "quoted" or 'quoted'
// words whole. It is not a shell: no escapes, no variables.
function words(s) {
  const re = /"([^"]*)"|'([^']*)'|(\S+)/g;
  const w = [];
  for (let m; (m = re.exec(s)); ) w.push(m[1] ?? m[2] ?? m[3]);
  return w;
}

function describe(err) {
  const e = { message: String(err?.message ?? err), name: err?.name };
  if (err?.code !== undefined) e.code = err.code;
  if (err?.data !== undefined) e.data = err.data;
  return e;
}

// connect returns the connected client and a function naming the
// protocol version it negotiated.
async function connect() {
  const info = { name: 'once-mcpgate-harness', version: '0.1.0' };
  const reqOpts = { timeout: opts.timeout };
  if (opts.sdk === 'new') {
    const { Client, StreamableHTTPClientTransport } = await import('@modelcontextprotocol/client');
    const { StdioClientTransport } = await import('@modelcontextprotocol/client/stdio');
    const mode = opts.negotiate === 'auto' || opts.negotiate === 'legacy' ? opts.negotiate : { pin: opts.negotiate };
    const client = new Client(info, { versionNegotiation: { mode, probe: { timeoutMs: 10000 } } });
    const [command, ...args] = words(opts.stdio ?? '');
    const transport = opts.http
      ? new StreamableHTTPClientTransport(new URL(opts.http))
      : new StdioClientTransport({ command, args, stderr: 'inherit' });
    await client.connect(transport, reqOpts);
    return { client, version: () => client.getNegotiatedProtocolVersion() };
  }
  const { Client } = await import('@modelcontextprotocol/sdk/client/index.js');
  const client = new Client(info);
  // The 1.x client keeps the negotiated version to itself; catch it in
  // the initialize result.
  let negotiated;
  const request = client.request.bind(client);
  client.request = async (req, ...rest) => {
    const res = await request(req, ...rest);
    if (req.method === 'initialize') negotiated = res.protocolVersion;
    return res;
  };
  let transport;
  if (opts.http) {
    const { StreamableHTTPClientTransport } = await import('@modelcontextprotocol/sdk/client/streamableHttp.js');
    transport = new StreamableHTTPClientTransport(new URL(opts.http));
  } else {
    const { StdioClientTransport } = await import('@modelcontextprotocol/sdk/client/stdio.js');
    const [command, ...args] = words(opts.stdio);
    transport = new StdioClientTransport({ command, args, stderr: 'inherit' });
  }
  await client.connect(transport, reqOpts);
  return { client, version: () => negotiated };
}

// call makes one tools/call. The options are the same in both SDKs;
// only the position differs: 1.x takes a result schema second.
async function call(client) {
  const params = { name: opts.tool, arguments: opts.args };
  if (opts.meta) params._meta = opts.meta;
  const o = { timeout: opts.timeout, resetTimeoutOnProgress: true };
  if (opts.progress) o.onprogress = (p) => out({ progress: p });
  try {
    const result = opts.sdk === 'new' ? await client.callTool(params, o) : await client.callTool(params, undefined, o);
    out({ ok: true, result });
    return true;
  } catch (err) {
    out({ error: describe(err) });
    return false;
  }
}

let client;
try {
  const c = await connect();
  client = c.client;
  out({ connected: { sdk: opts.sdk, protocolVersion: c.version(), server: client.getServerVersion() } });
} catch (err) {
  out({ error: { connect: true, ...describe(err) } });
  process.exit(2);
}

let allOK = true;
if (opts.list) {
  try {
    out({ ok: true, result: await client.listTools() });
  } catch (err) {
    out({ error: describe(err) });
    allOK = false;
  }
}
if (opts.tool) {
  for (let r = 0; r < opts.repeat; r++) {
    const round = await Promise.all(Array.from({ length: opts.concurrent }, () => call(client)));
    if (round.includes(false)) allOK = false;
  }
}
await client.close().catch(() => {});
process.exit(allOK ? 0 : 1);
