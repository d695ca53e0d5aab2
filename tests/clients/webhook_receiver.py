"""A webhook endpoint for the notification tests: verifies every delivery with the
`standardwebhooks` library and reports it as one JSON line on stdout.

Environment:
  RECEIVER_SECRETS  space-separated `whsec_` secrets; each is tried alone, so a line says
                    which of them verified the delivery.
  RECEIVER_PLAN     comma-separated answers to the first requests, in order: a status code,
                    or `hang` (never answer); later requests are answered 200.

The first line is `listening <port>`; then one line per request:
  {"id", "timestamp", "signature", "verified": [bool per secret], "type", "body", "raw",
   "answered", "unwrapped"}
`unwrapped` is, for a Managed Agents session event (`"type": "event"`), what the `anthropic`
SDK's `client.beta.webhooks.unwrap` made of it with the first secret: `[data.type, data.id]`,
or the error it raised.
"""

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from anthropic import Anthropic
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

SECRETS = os.environ.get("RECEIVER_SECRETS", "").split()
PLAN = [p for p in os.environ.get("RECEIVER_PLAN", "").split(",") if p]
LOCK = threading.Lock()
SEEN = [0]


ANTHROPIC = Anthropic(api_key="unused", base_url="http://127.0.0.1:9")


def unwrapped(raw, headers):
    try:
        event = ANTHROPIC.beta.webhooks.unwrap(raw.decode(), headers=headers, key=SECRETS[0])
        return [event.data.type, event.data.id, event.type, event.id]
    except Exception as e:  # the test shows what failed
        return f"{type(e).__name__}: {e}"


def verified(raw, headers):
    out = []
    for secret in SECRETS:
        try:
            Webhook(secret).verify(raw, headers)
            out.append(True)
        except WebhookVerificationError:
            out.append(False)
    return out


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        n = int(self.headers.get("content-length", "0"))
        raw = self.rfile.read(n)
        headers = {k.lower(): v for k, v in self.headers.items()}
        with LOCK:
            i = SEEN[0]
            SEEN[0] += 1
        answer = PLAN[i] if i < len(PLAN) else "200"
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        line = {
            "id": headers.get("webhook-id"),
            "timestamp": headers.get("webhook-timestamp"),
            "signature": headers.get("webhook-signature"),
            "verified": verified(raw, headers),
            "type": body.get("type") if isinstance(body, dict) else None,
            "body": body,
            "raw": raw.decode("utf-8", "replace"),
            "answered": answer,
            "unwrapped": unwrapped(raw, headers) if isinstance(body, dict) and body.get("type") == "event" else None,
        }
        with LOCK:
            print(json.dumps(line), flush=True)
        if answer == "hang":
            # The gateway is killed while it waits; the test then kills this endpoint too.
            time.sleep(3600)
            return
        self.send_response(int(answer))
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(f"listening {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
