#!/usr/bin/env python3
"""A tiny local test API for Moat's secrets example. It runs on the host,
not in the sandbox:

    python3 api.py PORT TOKEN_FILE

It answers every GET with whether the Authorization header it received is
"Bearer <the token in TOKEN_FILE>" and echoes that header back, as careless
APIs do. Moat's proxy puts the real token into the sandbox's request and
replaces it by the placeholder in the echo, so the program never sees it.
The API logs only whether the header matched, never the token.
"""
import http.server
import sys

port = int(sys.argv[1])
with open(sys.argv[2]) as f:
    token = f.read().strip()


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        auth = self.headers.get("Authorization", "")
        ok = auth == "Bearer " + token
        body = ("authorized: %s\nyou sent: %s\n" % ("yes" if ok else "no", auth)).encode()
        self.send_response(200 if ok else 401)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        print("api: GET %s authorized=%s" % (self.path, "yes" if ok else "no"), flush=True)

    def log_message(self, *args):
        pass  # the default log line would not hold the token, but say nothing we did not choose


server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
print("api: listening on 127.0.0.1:%d" % port, flush=True)
server.serve_forever()
