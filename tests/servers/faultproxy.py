#!/usr/bin/python3
"""A misbehaving HTTP server for the remote source's tests, in front of a real one (nginx).

    faultproxy.py UPSTREAM_PORT STATE   writes STATE/port, serves on 127.0.0.1 until killed

GET /FAULT/PATH forwards GET /PATH (with its Range and If-Match) to 127.0.0.1:UPSTREAM_PORT and
answers with the upstream's response, except as FAULT says. FAULT is NAME or NAME:N; with N, the
first N requests for that FAULT and PATH misbehave and later ones pass through (counters reset
with GET /_reset; GET /_count/FAULT/PATH says how many requests it has seen, GET
/_bytes/FAULT/PATH how many body bytes it passed through for them). /ok/PATH and
/ok:N/PATH pass through (N only keeps counts apart). GET /_headers/FAULT/PATH gives the headers
of the last request for FAULT and PATH, one "name: value" line each (names lowercased). A request
in absolute form (GET http://HOST/FAULT/PATH, as to an HTTP proxy) is served like /FAULT/PATH, so
the proxy stands in for any host through http_proxy.

  503, 429     answer that status (with an S3 error body; 429 with Retry-After: 0)
  reset        close the connection without an answer
  cut          send the headers and half the body, then close
  cutnth:N     the Nth request only (counting from 1) as cut, the others passed through
  stall        send the headers and a few bytes, then wait 30 s
  badrange     a Content-Range one byte off
  morebody     a body longer than its Content-Range (Content-Length says so)
  etag         a different ETag from the upstream's (the object "changed")
  norange      200 and the whole object, Range ignored
  endless      200 with no length and a body that never ends
  hugelen      206 claiming a total size of 2^50 bytes
  redirect     302 to /ok:redirected/PATH
  redirect-ftp 302 to ftp://127.0.0.1/PATH
  redirect-loop 302 to this same URL
  redirect-host 302 to http://localhost:PORT/ok:xhost/PATH (this proxy under another host name)
  drip         the headers, then the body at 3 bytes a second (a slow loris that never stalls)
  slow         the first request passed through, later ones send their body at 64 KiB a second
  weaketag     the upstream's ETag made weak (W/"...")
  noetag       no ETag (Last-Modified kept)
  noetag-flip  no ETag, and from the second request on the bytes of PATH-flip (PATH with
               "-flip" before its extension: another version of the object)
  novalidator  neither ETag nor Last-Modified
  bigerror     503 with a 64 KiB body (an S3 error code first)
  big404       404 with a 64 KiB body (an S3 error code first)

GET /?body=TEXT&... (a URL with no path) answers 200 with TEXT (percent-decoded) as the body.
"""
import http.client
import http.server
import os
import socket
import sys
import threading
import time
import urllib.parse

UP = int(sys.argv[1])
STATE = sys.argv[2]
counts = {}
sent = {}
heads = {}
lock = threading.Lock()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def upstream(self, path):
        c = http.client.HTTPConnection("127.0.0.1", UP, timeout=30)
        headers = {k: v for k, v in self.headers.items()
                   if k.lower() in ("range", "if-match", "if-unmodified-since")}
        c.request("GET", path, headers=headers)
        r = c.getresponse()
        body = r.read()
        c.close()
        return r.status, r.getheaders(), body

    def send(self, status, headers, body, skip=()):
        self.send_response_only(status)
        for k, v in headers:
            if k.lower() not in ("connection", "keep-alive", "transfer-encoding") + skip:
                self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def trickle(self, status, headers, body, piece, pause):
        """The headers, then the body `piece` bytes every `pause` seconds; the connection closes
        after it (or when the client goes)."""
        self.send_response_only(status)
        for k, v in headers:
            if k.lower() not in ("connection", "keep-alive", "transfer-encoding"):
                self.send_header(k, v)
        self.end_headers()
        self.close_connection = True
        try:
            for i in range(0, len(body), piece):
                self.wfile.write(body[i:i + piece])
                self.wfile.flush()
                time.sleep(pause)
        except OSError:
            return

    def do_GET(self):
        if self.path.startswith("http://"):  # absolute form: we are someone's proxy
            self.path = "/" + self.path.split("/", 3)[3]
        if self.path.startswith("/_headers/"):
            fault, _, path = self.path[len("/_headers/"):].partition("/")
            with lock:
                h = heads.get((fault, "/" + path), [])
            b = "".join("%s: %s\n" % (k.lower(), v) for k, v in h).encode()
            self.send(200, [("Content-Length", str(len(b)))], b)
            return
        if self.path.startswith("/?"):  # a URL with no path: its query says the body
            b = urllib.parse.parse_qs(self.path[2:]).get("body", [""])[0].encode()
            self.send(200, [("Content-Length", str(len(b))), ("ETag", '"q"')], b)
            return
        if self.path == "/_reset":
            with lock:
                counts.clear()
                sent.clear()
            self.send(200, [("Content-Length", "0")], b"")
            return
        if self.path.startswith(("/_count/", "/_bytes/")):
            fault, _, path = self.path[len("/_count/"):].partition("/")
            table = counts if self.path.startswith("/_count/") else sent
            with lock:
                n = str(table.get((fault, "/" + path), 0)).encode()
            self.send(200, [("Content-Length", str(len(n)))], n)
            return
        parts = self.path.split("/", 2)
        if len(parts) < 3:
            self.send(404, [("Content-Length", "0")], b"")
            return
        fault, path = parts[1], "/" + parts[2]
        name, _, n = fault.partition(":")
        with lock:
            seen = counts.get((fault, path), 0)
            counts[(fault, path)] = seen + 1
            heads[(fault, path)] = list(self.headers.items())
        if name == "cutnth":
            active, name = seen == int(n) - 1, "cut"
        else:
            active = name != "ok" and (not n or seen < int(n)) and not (name == "slow" and seen == 0)
        if not active:
            status, headers, body = self.upstream(path)
            with lock:
                sent[(fault, path)] = sent.get((fault, path), 0) + len(body)
            self.send(status, headers, body)
            return
        if name in ("bigerror", "big404"):
            code = "SlowDown" if name == "bigerror" else "NoSuchKey"
            body = ("<?xml version=\"1.0\"?><Error><Code>%s</Code><Message>big</Message>"
                    "</Error>" % code).encode() + b" " * 65536
            self.send(503 if name == "bigerror" else 404,
                      [("Content-Length", str(len(body))), ("Content-Type", "application/xml")],
                      body)
            return
        if name in ("503", "429"):
            code = "SlowDown" if name == "503" else "TooManyRequests"
            body = ("<?xml version=\"1.0\"?><Error><Code>%s</Code><Message>try again</Message>"
                    "</Error>" % code).encode()
            hdrs = [("Content-Length", str(len(body))), ("Content-Type", "application/xml")]
            if name == "429":
                hdrs.append(("Retry-After", "0"))
            self.send(int(name), hdrs, body)
            return
        if name.startswith("redirect"):
            to = {"redirect": "/ok:redirected" + path, "redirect-ftp": "ftp://127.0.0.1" + path,
                  "redirect-loop": self.path,
                  "redirect-host": "http://localhost:%d/ok:xhost%s" % (
                      self.server.server_address[1], path)}[name]
            self.send(302, [("Location", to), ("Content-Length", "0")], b"")
            return
        if name == "reset":
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                       b"\x01\x00\x00\x00\x00\x00\x00\x00")
            self.close_connection = True
            self.connection.close()
            return
        if name == "endless":
            self.send_response_only(200)
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            try:
                while True:
                    self.wfile.write(b"\0" * 65536)
            except OSError:
                return
        if name == "noetag-flip" and seen >= 1:
            stem, dot, ext = path.rpartition(".")
            status, headers, body = self.upstream(stem + "-flip" + dot + ext)
        else:
            status, headers, body = self.upstream(path)
        get = {k.lower(): v for k, v in headers}
        if name in ("weaketag", "noetag", "noetag-flip", "novalidator"):
            drop = ("etag", "last-modified") if name == "novalidator" else ("etag",)
            new = [(k, v) for k, v in headers if k.lower() not in drop]
            if name == "weaketag" and "etag" in get:
                new.append(("ETag", "W/" + get["etag"]))
            self.send(status, new, body)
            return
        if name == "cut":
            self.send(status, headers, body[: len(body) // 2])
            self.close_connection = True
        elif name == "drip":
            self.trickle(status, headers, body, 3, 1)
        elif name == "slow":
            self.trickle(status, headers, body, 16384, 0.25)
        elif name == "stall":
            self.send(status, headers, body[:16])
            time.sleep(30)
            self.close_connection = True
        elif name == "badrange" and "content-range" in get:
            unit, _, rest = get["content-range"].partition(" ")
            span, _, total = rest.partition("/")
            a, _, b = span.partition("-")
            headers = [(k, v) for k, v in headers if k.lower() != "content-range"]
            headers.append(("Content-Range", "%s %d-%d/%s" % (unit, int(a) + 1, int(b) + 1, total)))
            self.send(status, headers, body)
        elif name == "morebody":
            extra = body + b"\x55" * 4096
            headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
            headers.append(("Content-Length", str(len(extra))))
            self.send(status, headers, extra)
        elif name == "etag":
            headers = [(k, v) for k, v in headers if k.lower() != "etag"]
            headers.append(("ETag", '"changed-%d"' % seen))
            self.send(status, headers, body)
        elif name == "norange":
            c = http.client.HTTPConnection("127.0.0.1", UP, timeout=30)
            c.request("GET", path)
            r = c.getresponse()
            self.send(200, r.getheaders(), r.read())
            c.close()
        elif name == "hugelen" and "content-range" in get:
            unit, _, rest = get["content-range"].partition(" ")
            span, _, total = rest.partition("/")
            headers = [(k, v) for k, v in headers if k.lower() != "content-range"]
            headers.append(("Content-Range", "%s %s/%d" % (unit, span, 1 << 50)))
            self.send(status, headers, body)
        else:
            self.send(status, headers, body)


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # clients hang up on purpose (resets, stalls, bodies cut short)


srv = Server(("127.0.0.1", 0), Handler)
with open(os.path.join(STATE, "port.tmp"), "w") as f:
    f.write(str(srv.server_address[1]))
os.rename(os.path.join(STATE, "port.tmp"), os.path.join(STATE, "port"))
srv.serve_forever()
