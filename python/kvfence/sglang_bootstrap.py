"""SGLang's bootstrap server routes, for kvfence.

SGLang starts one bootstrap server per prefill instance; its prefill ranks
register there (PUT /route) and decode learns the instance's parallel layout
from it (GET /route) before it creates receivers; with DP attention it also
routes rooms to DP ranks (POST /register_dp_rank, POST /query_dp_ranks).
KVFenceBootstrapServer answers these routes with the semantics of SGLang's
CommonKVBootstrapServer (main-2606), on the standard library's HTTP server
(no aiohttp). GET /kvfence adds what kvfence's decode needs beyond SGLang's
PrefillServerInfo: the instance's kvfence rank base.

Discovery says where and how many; kvfence's mutual-TLS control plane still
decides who may write.
"""
import http.server
import json
import threading
import time
import urllib.parse
import urllib.request

from . import errors

_INFO_FIELDS = ("attn_tp_size", "attn_cp_size", "dp_size", "pp_size", "page_size", "kv_cache_dtype",
                "follow_bootstrap_room")


class Registry:
    """What the routes read and write (SGLang's server state)."""

    def __init__(self, entry_ttl_s=120.0):
        self.lock = threading.Lock()
        self.info = {}          # the instance's layout, from the first PUT
        self.ranks = {}         # (dp, cp, tp, pp) -> {"rank_ip", "rank_port"}
        self.registered = 0
        self.rank_base = None
        self.mla = None
        self.static = False     # prefill pairs statically (decode_addrs): no per-room decode announcements
        self.rooms = {}         # room -> (dp rank, time registered)
        self.decoders = {}      # room -> (decode TP, {decode rank: control addr}, time, extra): M:N pairing
        self.entry_ttl_s = entry_ttl_s

    def expected(self):
        i = self.info
        if not i:
            return None
        return i["dp_size"] * i["attn_cp_size"] * i["attn_tp_size"] * i["pp_size"]

    def ready(self):
        n = self.expected()
        return n is not None and self.registered >= n

    def put(self, d):
        with self.lock:
            dp_size = d["attn_dp_size"] if d["system_dp_size"] == 1 else d["system_dp_size"]
            defaults = dict(attn_tp_size=d["attn_tp_size"], attn_cp_size=d["attn_cp_size"], dp_size=dp_size,
                            pp_size=d["pp_size"], page_size=d.get("page_size"), kv_cache_dtype=d.get("kv_cache_dtype"),
                            follow_bootstrap_room=d.get("load_balance_method", "follow_bootstrap_room")
                            == "follow_bootstrap_room")
            for k, v in defaults.items():
                if self.info.get(k) is None:
                    self.info[k] = v
            dp = d["attn_dp_rank"] if d["system_dp_size"] == 1 else d["system_dp_rank"]
            self.ranks[(dp, d["attn_cp_rank"], d["attn_tp_rank"], d["pp_rank"])] = {
                "rank_ip": str(d["rank_ip"]), "rank_port": int(d["rank_port"])}
            self.registered = len(self.ranks)  # a rank registering again (a retry) counts once
            if self.rank_base is None and d.get("kvfence_rank_base") is not None:
                self.rank_base = int(d["kvfence_rank_base"])
                self.mla = bool(d.get("kvfence_mla", False))
                self.static = bool(d.get("kvfence_static", False))

    def get(self, q):
        """(status, body) of GET /route with query q."""
        keys = ("prefill_dp_rank", "prefill_cp_rank", "target_tp_rank", "target_pp_rank")
        vals = [q.get(k, [""])[0] for k in keys]
        if not all(vals):
            return 400, "Missing inputs for bootstrap server."
        vals = [int(v) for v in vals]
        with self.lock:
            if not self.ready():
                return 503, "Prefill server not fully registered yet (%d workers registered)." % self.registered
            if vals == [-1, -1, -1, -1]:
                return 200, {k: self.info.get(k) for k in _INFO_FIELDS}
            rank = self.ranks.get(tuple(vals))
        if rank is None:
            return 404, "Bootstrap info not found for dp_rank=%d cp_rank=%d tp_rank=%d pp_rank=%d" % tuple(vals)
        return 200, rank

    def register_room(self, d):
        with self.lock:
            self.rooms[int(d["bootstrap_room"])] = (int(d["dp_rank"]), time.time())

    def query_rooms(self, d):
        now = time.time()
        with self.lock:
            for room in [r for r, (_, t) in self.rooms.items() if now - t > self.entry_ttl_s]:
                del self.rooms[room]  # SGLang's cleanup of expired entries
            return {str(int(r)): self.rooms[int(r)][0] for r in d["bootstrap_rooms"] if int(r) in self.rooms}

    def put_decoder(self, d):
        """PUT /kvfence/decode: one decode rank says where it listens for
        room (the router paired that decode instance with this prefill)."""
        room, tp, rank = int(d["bootstrap_room"]), int(d["decode_tp"]), int(d["decode_rank"])
        if not 0 <= rank < tp:
            raise ValueError("decode_rank %d outside decode_tp %d" % (rank, tp))
        prefix = d.get("decode_prefix_len")
        if prefix is not None and int(prefix) < 0:
            raise ValueError("decode_prefix_len %s < 0" % prefix)
        with self.lock:
            old = self.decoders.get(room)
            same = old and old[0] == tp
            addrs = dict(old[1]) if same else {}
            extra = dict(old[3]) if same else {"radix": False, "decode_prefix_len": None}
            addrs[rank] = str(d["addr"])
            # decode's radix cache: prefill waits for the prefix length
            # decode announces with its metadata (kvfence.sglang_links).
            extra["radix"] = extra["radix"] or bool(d.get("radix"))
            if prefix is not None:
                extra["decode_prefix_len"] = int(prefix)
            self.decoders[room] = (tp, addrs, time.time(), extra)

    def get_decoder(self, q):
        """GET /kvfence/decode?room=R: every decode rank's address once all
        of that instance's ranks said where they are."""
        room = int(q["room"][0])
        now = time.time()
        with self.lock:
            for r in [r for r, (_, _, t, _) in self.decoders.items() if now - t > self.entry_ttl_s]:
                del self.decoders[r]
            e = self.decoders.get(room)
        if e is None or len(e[1]) < e[0]:
            return 404, "decode of room %d not announced yet" % room
        return 200, dict(e[3], decode_addrs=[e[1][r] for r in range(e[0])])

    def kvfence(self):
        with self.lock:
            if not self.ready() or self.rank_base is None:
                return 503, "kvfence prefill ranks not registered yet"
            return 200, {"rank_base": self.rank_base, "prefill_tp": self.info["attn_tp_size"], "mla": self.mla,
                         "dp_size": self.info["dp_size"], "pp_size": self.info["pp_size"],
                         "attn_cp_size": self.info["attn_cp_size"], "static": self.static}


def _handler(reg):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _reply(self, status, body):
            data = (json.dumps(body) if isinstance(body, dict) else str(body)).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json" if isinstance(body, dict) else "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _json(self):
            n = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(n) or b"{}")

        def _guard(self, fn):
            try:
                fn()
            except (KeyError, ValueError, TypeError) as exc:  # a bad request never stops the server
                self._reply(400, "bad request: %s" % exc)

        def do_GET(self):
            u = urllib.parse.urlparse(self.path)
            if u.path == "/health":
                return self._reply(200, "OK")
            if u.path == "/route":
                return self._guard(lambda: self._reply(*reg.get(urllib.parse.parse_qs(u.query))))
            if u.path == "/kvfence":
                return self._reply(*reg.kvfence())
            if u.path == "/kvfence/decode":
                return self._guard(lambda: self._reply(*reg.get_decoder(urllib.parse.parse_qs(u.query))))
            self._reply(404, "Not Found")

        def do_PUT(self):
            if urllib.parse.urlparse(self.path).path == "/kvfence/decode":
                return self._guard(lambda: (reg.put_decoder(self._json()), self._reply(200, "OK")))
            if urllib.parse.urlparse(self.path).path != "/route":
                return self._reply(404, "Not Found")
            self._guard(lambda: (reg.put(self._json()), self._reply(200, "OK")))

        def do_POST(self):
            p = urllib.parse.urlparse(self.path).path
            if p == "/register_dp_rank":
                return self._guard(lambda: (reg.register_room(self._json()), self._reply(200, "OK")))
            if p == "/query_dp_ranks":
                return self._guard(lambda: self._reply(200, reg.query_rooms(self._json())))
            if p == "/route":
                return self._reply(405, "Method not allowed")
            self._reply(404, "Not Found")

        def log_message(self, *a):
            pass

    return Handler


class Server:
    """The HTTP server on (host, port), serving on a daemon thread."""

    def __init__(self, host, port, entry_ttl_s=120.0):
        self.registry = Registry(entry_ttl_s)
        self.httpd = http.server.ThreadingHTTPServer((host, int(port)), _handler(self.registry))
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def request(method, url, body=None, timeout=5.0):
    """(status, parsed JSON or text) of one HTTP call; (None, reason) when
    the server cannot be reached."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    except (OSError, ValueError) as exc:
        return None, str(exc)
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode("utf-8", "replace")


def fetch_instance(bootstrap_addr, timeout=5.0):
    """The prefill instance at bootstrap_addr, as decode needs it: SGLang's
    PrefillServerInfo fields plus kvfence's rank base. None while it is not
    fully registered or unreachable."""
    st, info = request("GET", "http://%s/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1"
                              "&target_pp_rank=-1" % bootstrap_addr, timeout=timeout)
    if st != 200 or not isinstance(info, dict):
        return None
    st, kv = request("GET", "http://%s/kvfence" % bootstrap_addr, timeout=timeout)
    if st != 200 or not isinstance(kv, dict):
        return None
    return dict(info, **{"kvfence_" + k: v for k, v in kv.items()})


def register(host, port, payload, timeout=5.0, attempts=5):
    """PUT /route with SGLang's payload (retries like SGLang's prefill)."""
    delay = 0.2
    for _ in range(attempts):
        st, body = request("PUT", "http://%s:%d/route" % (host, int(port)), payload, timeout)
        if st == 200:
            return
        time.sleep(delay)
        delay = min(delay * 2, 5.0)
    raise errors.Unavailable("kvfence: prefill could not register at bootstrap %s:%s (%s %s)" % (host, port, st, body))


def announce_decoder(bootstrap_addr, room, decode_tp, decode_rank, addr, timeout=5.0, **extra):
    """Decode rank decode_rank tells the prefill instance at bootstrap_addr
    where it listens for room (extra: radix, decode_prefix_len); True once
    accepted."""
    st, _ = request("PUT", "http://%s/kvfence/decode" % bootstrap_addr,
                    dict(extra, bootstrap_room=int(room), decode_tp=int(decode_tp), decode_rank=int(decode_rank),
                         addr=addr), timeout)
    return st == 200


def lookup_decoder(bootstrap_addr, room, timeout=5.0):
    """(the decode instance's rank addresses for room, decode_prefix_len),
    or None while not every rank announced itself, or while a decode with
    its radix cache on has not announced the prefix it already holds (or
    the server is unreachable)."""
    st, body = request("GET", "http://%s/kvfence/decode?room=%d" % (bootstrap_addr, int(room)), timeout=timeout)
    if st != 200 or not isinstance(body, dict):
        return None
    prefix = body.get("decode_prefix_len")
    if body.get("radix") and prefix is None:
        return None
    return list(body["decode_addrs"]), int(prefix or 0)
