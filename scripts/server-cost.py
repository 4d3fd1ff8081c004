#!/usr/bin/env python3
"""Server CPU per uncontended SET + release, by release script: what a master spends on the
lock cycle's two commands (INFO cpu over pipelined pairs), whatever the client. Starts one
local redis-server (or $REDIS_SERVER) on a free port, stops it by its PID.

    python3 scripts/server-cost.py [ROUNDS]

Variants: the Redis page's Lua release (the floor's), the same under a `#!lua` shebang,
scripts::RELEASE_PLAIN (shebang, one key), scripts::RELEASE (shebang, the key, its line
and liveness set declared) and scripts::RELEASE_LEAN (shebang, the key alone: what the client
sends for a key without `}`), each a SET NX PX then the release of one token, 20,000 pairs per
round, rounds interleaved; medians in µs per pair.
"""
import os, re, socket, subprocess, sys, time

here = os.path.dirname(os.path.abspath(__file__))
src = open(os.path.join(here, "..", "src", "scripts.rs")).read()

def literals(body):
    return "".join(p.encode().decode("unicode_escape") for p in re.findall(r'"((?:[^"\\]|\\.)*)"', body))

def script(name):
    i = src.index(f"pub const {name}: Script = Script {{")
    body = src[i:src.index("sha:", i)]
    # A macro of scripts.rs that writes part of a source (announce_release!()).
    parts = re.split(r'(\w+)!\(\)', body)
    out = ""
    for k, part in enumerate(parts):
        if k % 2 == 0:
            out += literals(part)
        else:
            j = src.index(f"macro_rules! {part} {{")
            out += literals(src[j:src.index("};", j)])
    return out

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

port = free_port()
server = subprocess.Popen([os.environ.get("REDIS_SERVER", "redis-server"), "--port", str(port),
                           "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
try:
    for _ in range(100):
        try:
            conn = socket.create_connection(("127.0.0.1", port)); break
        except OSError:
            time.sleep(0.05)

    def enc(*a):
        out = b"*%d\r\n" % len(a)
        for x in a:
            x = x.encode() if isinstance(x, str) else x
            out += b"$%d\r\n%s\r\n" % (len(x), x)
        return out

    def reply_lines(n):
        data = b""
        while data.count(b"\r\n") < n:
            data += conn.recv(1 << 20)
        return data

    def call(*a):
        conn.sendall(enc(*a)); time.sleep(0.05); return conn.recv(1 << 20)

    def load(src):
        return call("SCRIPT", "LOAD", src).split(b"\r\n")[1].decode()

    def cpu():
        t = call("INFO", "cpu").decode()
        return sum(float(l.split(":")[1]) for l in t.splitlines()
                   if l.startswith(("used_cpu_sys:", "used_cpu_user:")))

    floor = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"
    variants = [("Lua release (floor)", load(floor), 1), ("the same, #!lua", load("#!lua\n" + floor), 1),
                ("RELEASE_PLAIN", load(script("RELEASE_PLAIN")), 1), ("RELEASE (3 keys)", load(script("RELEASE")), 3),
                ("RELEASE_LEAN", load(script("RELEASE_LEAN")), 1)]
    tok = "0123456789abcdef0123456789abcdef"
    n, batch = 20000, 100
    results = {name: [] for name, _, _ in variants}
    for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 4):
        for name, sha, nk in variants:
            c0 = cpu()
            for _ in range(n // batch):
                out = b""
                for i in range(batch):
                    k = "sku:%d" % i
                    keys = [k, "redlock-mux:{abc}:queue:" + k, "redlock-mux:{abc}:alive:" + k][:nk]
                    out += enc("SET", k, tok, "NX", "PX", "10000") + enc("EVALSHA", sha, str(nk), *keys, tok)
                conn.sendall(out)
                reply_lines(2 * batch)
            results[name].append((cpu() - c0) / n * 1e6)
    for name, v in results.items():
        print(f"{name:22} median {sorted(v)[len(v) // 2]:.2f} µs per pair  ({' '.join(f'{x:.2f}' for x in v)})")
finally:
    server.terminate(); server.wait()
