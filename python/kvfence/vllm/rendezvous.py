"""The connector's rendezvous: decode workers tell prefill workers where
to write (a JSON line over TCP, one answer each).

Every prefill worker listens; its address travels to the scheduler in the
worker's handshake metadata and from there to decode in kv_transfer_params.
What it guards: a message makes a prefill worker dial a decode rank and
send that rank a request's KV, so a forged one could pull a request's
cache to anywhere. Hence:

- it binds to loopback unless told otherwise (kv_connector_extra_config
  "rendezvous_host"), and refuses a non-loopback address without a secret;
- with a secret ("rendezvous_secret", or $KVFENCE_VLLM_SECRET) every
  message carries an HMAC-SHA256 over its body and a timestamp, and a
  message without a valid one, or older than max_age_s, is refused;
- a transfer id (128 random bits, from request_finished) is required too.

It never touches KV memory: handlers only record intents for the worker.
"""
import hashlib
import hmac
import ipaddress
import json
import os
import socket
import socketserver
import threading
import time

from .. import errors

MAX_LINE = 1 << 16


def is_loopback(host):
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _mac(secret, body):
    return hmac.new(secret, body.encode(), hashlib.sha256).hexdigest()


def seal(secret, msg):
    msg = dict(msg, ts=time.time())
    body = json.dumps(msg, sort_keys=True)
    return json.dumps({"body": body, "mac": _mac(secret, body) if secret else ""}) + "\n"


def unseal(secret, line, max_age_s):
    try:
        outer = json.loads(line)
        body = outer["body"]
        msg = json.loads(body)
    except (ValueError, KeyError, TypeError) as e:
        raise errors.InvalidArgument("rendezvous: malformed message: %s" % e)
    if secret and not hmac.compare_digest(outer.get("mac", ""), _mac(secret, body)):
        raise errors.FailedPrecondition("rendezvous: message not authenticated")
    if not isinstance(msg, dict) or abs(time.time() - float(msg.get("ts", 0))) > max_age_s:
        raise errors.FailedPrecondition("rendezvous: message expired or without a timestamp")
    return msg


def secret_from(extra):
    s = extra.get("rendezvous_secret") or os.environ.get("KVFENCE_VLLM_SECRET", "")
    return s.encode() if s else b""


class Server:
    """Answers each message with handler(msg) -> dict (or an error)."""

    def __init__(self, handler, host="127.0.0.1", port=0, secret=b"", max_age_s=60.0):
        if not is_loopback(host) and not secret:
            raise errors.FailedPrecondition(
                "kvfence.vllm: rendezvous on %s (not loopback) needs a secret: set kv_connector_extra_config "
                "rendezvous_secret or $KVFENCE_VLLM_SECRET" % host)

        class H(socketserver.StreamRequestHandler):
            def handle(self):
                self.connection.settimeout(10)
                line = self.rfile.readline(MAX_LINE)
                try:
                    msg = unseal(secret, line, max_age_s)
                    reply = dict(handler(msg) or {}, ok=True)
                except errors.KVFenceError as e:
                    reply = {"ok": False, "code": e.code, "error": str(e)}
                except Exception as e:  # a handler bug answers; the server stays up
                    reply = {"ok": False, "code": errors.INTERNAL, "error": "%s: %s" % (type(e).__name__, e)}
                try:
                    self.wfile.write((json.dumps(reply) + "\n").encode())
                except OSError:
                    pass

        class S(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.srv = S((host, port), H)
        self.host, self.port = self.srv.server_address[:2]
        self.t = threading.Thread(target=self.srv.serve_forever, name="kvfence-rendezvous", daemon=True)
        self.t.start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


def call(host, port, msg, secret=b"", timeout=30.0):
    """Sends msg, returns the answer dict; an error answer raises its class."""
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as s:
            s.sendall(seal(secret, msg).encode())
            f = s.makefile("rb")
            line = f.readline(MAX_LINE)
    except OSError as e:
        raise errors.Unavailable("rendezvous %s:%s: %s" % (host, port, e))
    if not line:
        raise errors.Unavailable("rendezvous %s:%s closed without an answer" % (host, port))
    reply = json.loads(line)
    if not reply.get("ok"):
        raise errors.from_code(int(reply.get("code", errors.UNKNOWN)), reply.get("error", "refused"))
    return reply
