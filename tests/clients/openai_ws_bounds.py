"""The bounds of a Responses WebSocket, against a gateway whose principals may hold one stream
and whose sockets close after one idle second: a second socket of the same principal is 429
before any upgrade, an idle socket is closed with code 1000 ("idle"), and its place is free
again afterwards.

Env: TURNSTILE_URL (base URL ending in /v1), TURNSTILE_KEY. Prints ALL OK at the end.
"""
import os

from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

URL = os.environ["TURNSTILE_URL"].replace("http://", "ws://") + "/responses"
AUTH = {"Authorization": "Bearer " + os.environ["TURNSTILE_KEY"]}

first = connect(URL, additional_headers=AUTH)
try:
    connect(URL, additional_headers=AUTH)
    raise SystemExit("a second socket over the principal's bound was upgraded")
except InvalidStatus as e:
    assert e.response.status_code == 429, e.response.status_code
    assert e.response.headers["x-turnstile-error-code"] == "capacity_exhausted"

try:
    first.recv(timeout=20)
    raise SystemExit("an idle socket got a message instead of a close")
except ConnectionClosed as e:
    assert e.rcvd is not None and e.rcvd.code == 1000 and e.rcvd.reason == "idle", e

again = connect(URL, additional_headers=AUTH)
again.close()
print("ALL OK")
