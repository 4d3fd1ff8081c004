#!/usr/bin/env python3
"""Writes the checked-in seeds of the `engine` fuzz target: fuzz/seeds/engine/.

Run from anywhere: `python3 fuzz/make_engine_seeds.py`. It rewrites only the files it names
(crash reproducers added by hand, `crash-*`, are left alone). The layout is documented at
the top of fuzz/engine_body.rs.
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "seeds", "engine")

ACQUIRE, EXTEND, RELEASE = 0, 1, 2
MS = 1_000_000  # ns

# event kinds
OK, NULL, INT, ERR, NOSCRIPT, GARBAGE, TIMEOUT, CLOSED, DUP, RAW = range(10)
CONNECT, DOWN, AMNESIAC, PENDING, TICK, LOADING = range(10, 16)


def hdr(n, req=ACQUIRE, ttl_ms=10_000, elapsed_ms=5, drift=5, min_validity_us=0):
    """n masters; drift byte b gives factor b / 256 * 0.5 (5 -> ~0.0098)."""
    return (
        bytes([(n - 1) % 7, req])
        + struct.pack("<Q", ttl_ms * MS)
        + struct.pack("<Q", elapsed_ms * MS)
        + bytes([drift])
        + struct.pack("<I", min_validity_us)
    )


def ev(master, kind, payload=b""):
    return bytes([master, kind]) + payload


def raw(data):
    return ev(0, RAW, bytes([len(data)]) + data)


def raw_to(master, data):
    return ev(master, RAW, bytes([len(data)]) + data)


SEEDS = {
    "quorum_ok_3": hdr(3) + ev(0, OK) + ev(1, OK),
    "all_ok_5": hdr(5) + b"".join(ev(i, OK) for i in range(5)),
    "taken_majority_3": hdr(3) + ev(0, NULL) + ev(1, NULL | 0x10) + ev(2, OK),
    "mixed_5_timeout": hdr(5) + ev(0, OK) + ev(1, NULL) + ev(2, OK) + ev(3, TIMEOUT),
    "noscript_then_ok_extend": hdr(3, EXTEND) + ev(0, NOSCRIPT) + ev(0, OK) + ev(1, OK),
    "noscript_twice_release": hdr(3, RELEASE) + ev(1, NOSCRIPT) + ev(1, NOSCRIPT) + ev(2, INT, b"\x01"),
    "garbage_frames": hdr(5) + b"".join(ev(i, GARBAGE, bytes([i * 3])) for i in range(5)),
    "raw_replies": hdr(3)
    + raw_to(0, b"+OK\r\n")
    + raw_to(1, b"$-1\r\n")
    + raw_to(2, b"_\r\n"),
    "raw_hostile": hdr(3)
    + raw_to(0, b"$9223372036854775807\r\n")
    + raw_to(1, b"+O\rK\r\n")
    + raw_to(2, b"*2\r\n:1\r\n"),
    "late_duplicate_after_quorum": hdr(3) + ev(0, OK) + ev(1, OK) + ev(1, DUP) + ev(2, OK) + ev(2, DUP),
    "duplicates_never_make_quorum": hdr(3) + ev(0, OK) + ev(0, DUP) + ev(0, DUP) + ev(0, OK),
    "out_of_range_master": hdr(1) + ev(5, OK) + ev(7, OK) + ev(0, NULL),
    "faults_everywhere_7": hdr(7)
    + ev(0, CLOSED)
    + ev(1, CONNECT)
    + ev(2, DOWN)
    + ev(3, AMNESIAC)
    + ev(4, LOADING)
    + ev(5, OK)
    + ev(6, OK),
    "validity_used_up": hdr(3, ttl_ms=100, elapsed_ms=99) + ev(0, OK) + ev(1, OK),
    "min_validity_not_met": hdr(3, ttl_ms=100, elapsed_ms=10, min_validity_us=90_000)
    + ev(0, OK)
    + ev(1, OK),
    "max_ttl_huge_elapsed": bytes([4, 0])
    + b"\xff" * 16
    + bytes([255])
    + b"\xff\xff\xff\xff"
    + ev(0, OK)
    + ev(1, OK)
    + ev(2, OK),
    "zero_ttl": hdr(3, ttl_ms=0, elapsed_ms=0, drift=0) + ev(0, OK) + ev(1, OK) + ev(2, OK),
    "drift_max_7": hdr(7, drift=255) + b"".join(ev(i, OK) for i in range(7)),
    "timeout_first": hdr(5) + ev(0, TIMEOUT) + ev(1, OK) + ev(2, OK) + ev(3, OK),
    "time_passes": hdr(3, ttl_ms=50, elapsed_ms=0)
    + ev(0, OK)
    + ev(0, TICK, struct.pack("<I", 30_000))
    + ev(0, TICK, struct.pack("<I", 30_000))
    + ev(1, OK),
    "pending_is_not_an_answer": hdr(3) + ev(0, PENDING) + ev(0, OK) + ev(1, PENDING) + ev(1, OK),
    "integers_release_extend": hdr(3, RELEASE)
    + ev(0, INT, bytes([250]))
    + ev(1, INT, bytes([251]))
    + ev(2, INT, bytes([252]))
    + ev(2, INT, bytes([0])),
    "even_masters_4": hdr(4) + ev(0, OK) + ev(1, OK) + ev(2, NULL) + ev(3, OK),
    "errors_then_expire_5": hdr(5) + ev(0, ERR) + ev(1, ERR | 0x10) + ev(2, OK) + ev(0, TIMEOUT) + ev(3, OK),
}


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
    print(f"wrote {len(SEEDS)} seeds to {OUT}")


if __name__ == "__main__":
    main()
