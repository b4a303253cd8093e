// A proxy on loopback between a client and the real server, for tests of
// what the network does: it forwards every request as it is, and lets a
// test hold a request (hold) or cut the connection after the server
// answered (cut), the reply lost. Not a test file: the suites import it.
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";

export class Proxy {
  /** [path, body] of every request, in order. */
  readonly seen: [string, string][] = [];
  /** Called before forwarding; the request waits for it. */
  hold?: (path: string, body: string) => Promise<void> | void;
  /** Returns true to forward the request, then close without the reply. */
  cut?: (path: string, body: string) => boolean;
  private readonly server: Server;

  private constructor(readonly upstream: string) {
    this.server = createServer(async (req, res) => {
      const chunks: Buffer[] = [];
      for await (const c of req) chunks.push(c as Buffer);
      const path = req.url ?? "/";
      const body = Buffer.concat(chunks).toString("utf8");
      this.seen.push([path, body]);
      try {
        await this.hold?.(path, body);
        const headers: Record<string, string> = {};
        for (const h of ["authorization", "content-type"]) if (req.headers[h]) headers[h] = String(req.headers[h]);
        const up = await fetch(this.upstream + path, { method: req.method, headers, body: chunks.length ? body : undefined, signal: AbortSignal.timeout(120_000) });
        const out = Buffer.from(await up.arrayBuffer());
        if (this.cut?.(path, body)) {
          req.socket.destroy();
          return;
        }
        res.writeHead(up.status, { "Content-Type": up.headers.get("content-type") ?? "", "Content-Length": out.length });
        res.end(out);
      } catch {
        req.socket.destroy();
      }
    });
  }

  static async start(upstream: string): Promise<Proxy> {
    const p = new Proxy(upstream.replace(/\/+$/, ""));
    await new Promise<void>((r) => p.server.listen(0, "127.0.0.1", r));
    return p;
  }

  get url(): string {
    return `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  paths(): string[] {
    return this.seen.map(([p]) => p);
  }

  close(): Promise<void> {
    this.server.closeAllConnections();
    return new Promise((r) => this.server.close(() => r()));
  }
}
