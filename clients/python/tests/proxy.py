"""A proxy on loopback between a client and the real server, for tests of
what the network does: it forwards every request as it is, and lets a
test hold a request (hold) or cut the connection after the server
answered (cut), the reply lost."""

import http.server
import threading
import urllib.error
import urllib.request


class Proxy:
    def __init__(self, upstream):
        self.upstream = upstream.rstrip("/")
        self.seen = []  # (path, body) of every request, in order
        self.hold = None  # hold(path, body): called before forwarding, may block
        self.cut = None  # cut(path, body) -> True: forward, then close without the reply
        self.lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def forward(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                with proxy.lock:
                    proxy.seen.append((self.path, body))
                if proxy.hold:
                    proxy.hold(self.path, body)
                req = urllib.request.Request(proxy.upstream + self.path, data=body, method=self.command)
                for h in ("Authorization", "Content-Type"):
                    if self.headers.get(h):
                        req.add_header(h, self.headers[h])
                try:
                    with urllib.request.urlopen(req, timeout=120) as resp:
                        status, ctype, out = resp.status, resp.headers.get("Content-Type", ""), resp.read()
                except urllib.error.HTTPError as e:
                    status, ctype, out = e.code, e.headers.get("Content-Type", ""), e.read()
                if proxy.cut and proxy.cut(self.path, body):
                    self.close_connection = True
                    return
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(out)))
                    self.end_headers()
                    self.wfile.write(out)
                except OSError:
                    self.close_connection = True  # the client gave up on it

            do_GET = do_POST = forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def paths(self):
        with self.lock:
            return [p for p, _ in self.seen]

    def close(self):
        self.server.shutdown()
        self.server.server_close()
