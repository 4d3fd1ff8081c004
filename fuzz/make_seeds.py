#!/usr/bin/env python3
"""Writes the checked-in seed corpus: fuzz/seeds/{parse,fragment,roundtrip}/.

Run from anywhere: `python3 fuzz/make_seeds.py`. It rewrites the seed directories; crash
reproducers added by hand (`crash-*`) are left alone. Each seed is small and named
after what it exercises.
"""
import os

HERE = os.path.dirname(os.path.abspath(__file__))

LOCK_PIPELINE = (
    b"+OK\r\n$-1\r\n:1\r\n:0\r\n-NOSCRIPT No matching script. Please use EVAL.\r\n"
)

# name -> bytes: valid frames, hostile and invalid ones.
CASES = {
    # --- the replies a lock client gets
    "ok": b"+OK\r\n",
    "null_bulk": b"$-1\r\n",
    "null_resp3": b"_\r\n",
    "int_1": b":1\r\n",
    "int_0": b":0\r\n",
    "int_neg1": b":-1\r\n",
    "noscript": b"-NOSCRIPT No matching script. Please use EVAL.\r\n",
    "err_args": b"-ERR wrong number of arguments\r\n",
    "lock_pipeline": LOCK_PIPELINE,
    "lock_pipeline_x3": LOCK_PIPELINE * 3 + b"_\r\n",
    # --- every type, valid
    "bulk": b"$3\r\nfoo\r\n",
    "bulk_empty": b"$0\r\n\r\n",
    "bulk_binary": b"$6\r\n\r\n\x00\xff\r\n\r\n",
    "int_min": b":-9223372036854775808\r\n",
    "int_max": b":9223372036854775807\r\n",
    "array": b"*3\r\n$3\r\nSET\r\n$3\r\nkey\r\n:5\r\n",
    "array_empty": b"*0\r\n",
    "null_array": b"*-1\r\n",
    "nested": b"*2\r\n*2\r\n:1\r\n*1\r\n+a\r\n%1\r\n+k\r\n~2\r\n#t\r\n#f\r\n",
    "map": b"%2\r\n+server\r\n+redis\r\n+proto\r\n:3\r\n",
    "set": b"~3\r\n:1\r\n:2\r\n:3\r\n",
    "push": b">3\r\n+message\r\n+chan\r\n$5\r\nhello\r\n",
    "attribute": b"|1\r\n+key-popularity\r\n%1\r\n$1\r\na\r\n,0.1923\r\n:42\r\n",
    "attribute_in_array": b"*2\r\n|1\r\n+ttl\r\n:3\r\n:1\r\n:2\r\n",
    "attribute_only": b"|1\r\n+a\r\n+b\r\n",
    "attribute_dangling_in_array": b"*1\r\n:1\r\n|1\r\n+a\r\n+b\r\n",
    "booleans": b"*2\r\n#t\r\n#f\r\n",
    "doubles": b"*7\r\n,1.5\r\n,-3\r\n,inf\r\n,-inf\r\n,nan\r\n,1e10\r\n,0\r\n",
    "big_number": b"(3492890328409238509324850943850943825024385\r\n",
    "big_number_neg": b"(-1\r\n",
    "bulk_error": b"!21\r\nSYNTAX invalid syntax\r\n",
    "verbatim": b"=15\r\ntxt:Some string\r\n",
    "verbatim_mkd": b"=8\r\nmkd:# hi\r\n",
    "hello3_reply": (
        b"%7\r\n$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n$5\r\n7.2.4\r\n"
        b"$5\r\nproto\r\n:3\r\n$2\r\nid\r\n:5\r\n$4\r\nmode\r\n$10\r\nstandalone\r\n"
        b"$4\r\nrole\r\n$6\r\nmaster\r\n$7\r\nmodules\r\n*0\r\n"
    ),
    # --- hostile: limits
    "huge_bulk_header": b"$9223372036854775807\r\n",
    "huge_bulk_header_over_i64": b"$9223372036854775808\r\n",
    "huge_bulk_header_u64": b"$18446744073709551616\r\n",
    "huge_array_header": b"*9223372036854775807\r\n",
    "huge_map_header": b"%4611686018427387904\r\n",
    "huge_verbatim_header": b"=9223372036854775807\r\n",
    "bulk_usize_max": b"$18446744073709551615\r\n",
    "bulk_usize_max_minus1": b"$18446744073709551614\r\nab",
    "array_usize_max": b"*18446744073709551615\r\n:1\r\n",
    "map_pairs_overflow": b"%9223372036854775808\r\n+a\r\n",
    "attribute_pairs_overflow": b"|9223372036854775808\r\n+a\r\n",
    "verbatim_usize_max": b"=18446744073709551615\r\ntxt:",
    "bulk_error_usize_max": b"!18446744073709551615\r\n",
    "too_deep_40": b"*1\r\n" * 40 + b":1\r\n",
    "too_deep_200": b"*1\r\n" * 200 + b":1\r\n",
    "deep_32": b"*1\r\n" * 32 + b":1\r\n",
    "deep_33": b"*1\r\n" * 33 + b":1\r\n",
    "deep_128": b"*1\r\n" * 128 + b":1\r\n",
    "deep_129": b"*1\r\n" * 129 + b":1\r\n",
    "deep_mixed": b"%1\r\n+k\r\n~1\r\n>1\r\n*1\r\n" * 6 + b"_\r\n",
    "deep_attributes": b"|1\r\n+a\r\n" * 40 + b":1\r\n",
    "long_line": b"+" + b"a" * 300 + b"\r\n",
    "long_line_unterminated": b"+" + b"a" * 300,
    "long_header_digits": b"$" + b"0" * 100 + b"3\r\nfoo\r\n",
    # --- hostile: strictness
    "cr_in_simple": b"+O\rK\r\n",
    "lf_in_simple": b"+O\nK\r\n",
    "lf_only": b"+OK\n",
    "bulk_no_terminator": b"$3\r\nfooXY",
    "bulk_short_terminator": b"$3\r\nfoo\rX",
    "bulk_neg2": b"$-2\r\n",
    "array_neg2": b"*-2\r\n",
    "space_in_length": b"$ 3\r\nfoo\r\n",
    "length_trailing_space": b"*1 \r\n:1\r\n",
    "int_overflow": b":9223372036854775808\r\n",
    "int_underflow": b":-9223372036854775809\r\n",
    "int_empty": b":\r\n",
    "int_minus_only": b":-\r\n",
    "int_plus": b":+5\r\n",
    "int_leading_zero": b":007\r\n",
    "int_neg_zero": b":-0\r\n",
    "int_letters": b":12a\r\n",
    "length_plus": b"$+3\r\nfoo\r\n",
    "length_leading_zero": b"$03\r\nfoo\r\n",
    "null_with_payload": b"_x\r\n",
    "bool_bad": b"#x\r\n",
    "bool_long": b"#tt\r\n",
    "double_bad": b",1.2.3\r\n",
    "double_empty": b",\r\n",
    "big_number_bad": b"(12a\r\n",
    "verbatim_no_colon": b"=5\r\ntxt_x\r\n",
    "verbatim_short": b"=2\r\ntx\r\n",
    "unknown_type": b"?\r\n",
    "nul_byte": b"\x00",
    "empty": b"",
    # --- RESP3 streaming (unsupported), never confused with RESP2 null
    "streamed_bulk": b"$?\r\n;4\r\nHell\r\n;5\r\no wor\r\n;1\r\nd\r\n;0\r\n",
    "streamed_array": b"*?\r\n:1\r\n:2\r\n.\r\n",
    "streamed_map": b"%?\r\n+a\r\n:1\r\n.\r\n",
    "stream_chunk_alone": b";4\r\nHell\r\n",
    "stream_end_alone": b".\r\n",
    # --- pipelines with a bad tail
    "pipeline_then_partial": LOCK_PIPELINE + b"$5\r\nab",
    "pipeline_then_error": LOCK_PIPELINE + b"$3\r\nfooXY",
    "pipeline_resp3": b"_\r\n#t\r\n,1.5\r\n>2\r\n+invalidate\r\n*1\r\n$3\r\nkey\r\n:1\r\n",
}

# The fragment target reads its first byte as: chunk size (1 + low 5 bits),
# parse_with_attribute (bit 5), reset before every call (bit 6), tight limits (bit 7).
FRAGMENT_SELECTORS = [0x00, 0x22, 0x06, 0x40, 0x83, 0xE0, 0x3F]
FRAGMENT_CASES = [
    "ok", "null_bulk", "lock_pipeline", "lock_pipeline_x3", "array", "nested", "map",
    "push", "attribute", "attribute_in_array", "hello3_reply", "doubles", "verbatim",
    "bulk_binary", "huge_bulk_header", "bulk_usize_max", "deep_128", "too_deep_40", "deep_32", "long_line",
    "long_line_unterminated", "cr_in_simple", "bulk_no_terminator", "int_overflow",
    "streamed_bulk", "pipeline_then_partial", "pipeline_then_error", "pipeline_resp3",
    "length_trailing_space", "big_number",
]

# Command-shaped inputs for the roundtrip target's encode_command half: tag byte
# (% 4: 0/1 bytes with a length byte, 2 Int, 3 Uint, 8 LE bytes), then data.
COMMANDS = {
    "cmd_set_nx_px": (
        b"\x00\x03SET" + b"\x00\x0alock:order" + b"\x00\x24" + b"x" * 36 + b"\x00\x02NX"
        + b"\x00\x02PX" + b"\x03" + (30000).to_bytes(8, "little")
    ),
    "cmd_evalsha": b"\x00\x07EVALSHA\x00\x28" + b"a" * 40 + b"\x02" + (1).to_bytes(8, "little"),
    "cmd_negative_int": b"\x02" + (-1 & (2**64 - 1)).to_bytes(8, "little"),
    "cmd_int_min_uint_max": b"\x02" + (2**63).to_bytes(8, "little") + b"\x03" + b"\xff" * 8,
    "cmd_binary_crlf": b"\x01\x06\r\n\x00\xff\r\n\x01\x00",
    "cmd_truncated": b"\x00\x3fshort",
}


WRITTEN = set()


def write(target, name, data):
    WRITTEN.add((target, name))
    d = os.path.join(HERE, "seeds", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def main():
    for name, data in CASES.items():
        write("parse", name, data)
        write("roundtrip", name, data)
    for name, data in COMMANDS.items():
        write("roundtrip", name, data)
    for i, name in enumerate(FRAGMENT_CASES):
        sel = FRAGMENT_SELECTORS[i % len(FRAGMENT_SELECTORS)]
        write("fragment", "%s_%02x" % (name, sel), bytes([sel]) + CASES[name])
    # Every selector on the lock pipeline.
    for sel in FRAGMENT_SELECTORS:
        write("fragment", "lock_pipeline_x3_sel%02x" % sel, bytes([sel]) + CASES["lock_pipeline_x3"])
    # Drop generated seeds that are no longer generated.
    for target in ("parse", "fragment", "roundtrip"):
        d = os.path.join(HERE, "seeds", target)
        for name in os.listdir(d):
            if not name.startswith("crash-") and (target, name) not in WRITTEN:
                os.remove(os.path.join(d, name))


if __name__ == "__main__":
    main()
