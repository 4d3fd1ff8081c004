#!/usr/bin/env python3
"""Writes the checked-in seeds of the `engine` fuzz target: fuzz/seeds/engine/.

Run from anywhere: `python3 fuzz/make_engine_seeds.py`. It rewrites only the files it names
(crash reproducers added by hand, `crash-*`, are left alone) and removes nothing. The layout
is documented at the top of fuzz/engine_body.rs: a 23-byte header (the client's settings),
then events. The body drives the real core; each seed says what it makes the client do.
To see it: `ENGINE_TRACE=1 ENGINE_INPUT=fuzz/seeds/engine/<name> cargo test --test
fuzz_engine_corpus replay_one -- --ignored --nocapture`.
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "seeds", "engine")

# Link bytes: every lock link, every subscription link; else link b % 2N.
LOCK, SUB = 255, 254

# Submissions.
TRY, LOCK_, DEADLINE, MANY = range(4)

# Moods of ANSWER.
YES, NO, NOSCRIPT, ERR, RESTARTED, SAME, SLOW, WRONG = range(8)

# Canned replies (see the table in engine_body.rs).
C_OK, C_NULL, C_NULL3, C_ZERO, C_ONE, C_MINUS1, C_5000, C_HOLDER16 = range(8)
C_NOSCRIPT, C_ERR, C_NOPERM, C_WRONGPASS, C_SHA, C_INFO, C_INFO_UP0, C_INFO_SAME = range(8, 16)
C_INFO_EMPTY, C_CONFIG_DURABLE, C_CONFIG_NOT, C_SUBSCRIBED, C_UNSUBSCRIBED = range(16, 21)
C_RELEASED_HOLDER, C_RELEASED_LAST, C_TURN, C_FOREIGN, C_TWO, C_BAD_SHA = range(21, 27)
C_QUEUED, C_HOLDER_NO_EXPIRY, C_JUNK_ARRAY, C_NULL_ARRAY, C_I64_MAX = range(27, 32)


def hdr(
    n=3,
    fencing=False,
    durable=False,
    poll=False,
    fair=False,
    guard=False,
    password=False,
    user=False,
    db=False,
    retries=2,
    delay=50,
    jitter=10,
    node=0,
    drift=5,
    minv=0,
    ttl=(2, 10),
    ttl2=(2, 20),
    extra=0,
    ct=124,
    st=124,
    manual=0,
    cap=0,
    seed=1,
    graceful=False,
):
    """The client: n masters, flags, retry count / delay / jitter (ms), node timeout (ms, 0:
    default), drift byte (b / 256 * 0.5), minimum validity (x 100 us), TTLs as (scale, value)
    (scale 0 ms, 1 x10 ms, 2 s, 3 MAX_TTL - v ms), amnesia extra (ms), connect timeout
    (1 + b) x 8 ms, stall (1 + b) x 16 ms, manual connect mask, write cap, seed, ending."""
    flags = (
        (1 if fencing else 0)
        | (2 if durable else 0)
        | (4 if poll else 0)
        | (8 if fair else 0)
        | (16 if guard else 0)
        | (32 if password else 0)
        | (64 if user else 0)
        | (128 if db else 0)
    )
    return (
        bytes([(n - 1) % 7, flags, retries, delay, jitter, node, drift])
        + struct.pack("<H", minv)
        + bytes([ttl[0]])
        + struct.pack("<H", ttl[1])
        + bytes([ttl2[0]])
        + struct.pack("<H", ttl2[1])
        + struct.pack("<H", extra)
        + bytes([ct, st, manual, cap, seed, 1 if graceful else 0])
    )


def submit(op, r=0, three=False, d=0):
    return bytes([0, op | (r << 2) | ((1 if three else 0) << 4), d])


def release(i=0):
    return bytes([1, i])


def extend(i=0):
    return bytes([2, i])


def detach(i=0):
    return bytes([3, i])


def cancel(i=0):
    return bytes([4, i])


def connect(link, fail=False):
    return bytes([5, link, 1 if fail else 0])


def raw(link, data):
    return bytes([6, link, len(data)]) + data


def canned(link, r, param=0, split=0):
    return bytes([7, link, r + 32 * param, split])


def answer(link=LOCK, mood=YES, count=0, split=0):
    return bytes([8, link, mood, count, split])


def close(link, f=0):
    return bytes([9, link, f])


def time_us(v):
    return bytes([10, 0]) + struct.pack("<I", v)


def time_ms(v):
    return bytes([10, 1]) + struct.pack("<I", v)


def time_s(v):
    return bytes([10, 2]) + struct.pack("<I", v)


def time_past_max_ttl(ms=0):
    return bytes([10, 3]) + struct.pack("<I", ms)


def timer(extra_us=0):
    return bytes([11, extra_us])


def away(ms):
    """The single-owner client was away from the loop `ms` ms (shift_clocks)."""
    return bytes([12]) + struct.pack("<H", ms)


def granted(link=LOCK):
    """A try_lock on resource 0, every master says yes."""
    return submit(TRY, 0) + answer(link, YES)


SEEDS = {
    # Grants, refusals, releases.
    "try_lock_granted_then_released": hdr()
    + granted()
    + release(0)
    + answer(LOCK, YES),
    "try_lock_taken": hdr() + submit(TRY, 1) + answer(LOCK, NO),
    "split_votes_5": hdr(n=5)
    + submit(TRY, 0)
    + answer(0, YES)
    + answer(1, YES)
    + answer(2, NO)
    + answer(3, NO)
    + answer(4, ERR),
    "quorum_of_7_then_late_answers": hdr(n=7)
    + submit(TRY, 2)
    + answer(0)
    + answer(1)
    + answer(2)
    + answer(3)
    + answer(4, NO)
    + answer(5, NO)
    + answer(6, ERR),
    "release_not_held": hdr() + granted() + release(0) + answer(LOCK, NO),
    # A release and an extend that one master answers: their rounds time out (50 ms).
    "release_round_times_out": hdr()
    + granted()
    + time_s(1)
    + release(0)
    + answer(0, YES)
    + time_ms(60),
    "extend_round_times_out": hdr(ttl=(2, 100))
    + granted()
    + time_s(1)
    + extend(0)
    + answer(1, YES)
    + time_ms(51),
    "lock_many_granted_three": hdr()
    + submit(MANY, 0, three=True)
    + answer(LOCK, YES)
    + release(0)
    + answer(LOCK, YES),
    # NOSCRIPT: the request is sent again with EVAL.
    "noscript_acquire_many_then_eval": hdr(retries=0)
    + submit(MANY, 1)
    + answer(LOCK, NOSCRIPT)
    + answer(LOCK, YES),
    "noscript_release_then_eval": hdr()
    + granted()
    + release(0)
    + answer(LOCK, NOSCRIPT)
    + answer(LOCK, YES),
    "noscript_extend_then_eval": hdr()
    + granted()
    + extend(0)
    + answer(LOCK, NOSCRIPT)
    + answer(LOCK, YES),
    # Disconnects mid-round: the cleanup goes where the key may be.
    "disconnect_mid_round": hdr(graceful=True)
    + submit(TRY, 0)
    + answer(0, YES)
    + close(1, 0)
    + close(2, 1)
    + timer(),
    "disconnect_after_write_then_reconnect": hdr()
    + submit(LOCK_, 0)
    + close(LOCK, 2)
    + timer(5)
    + timer(5)
    + answer(LOCK, YES),
    # Time: rounds expire, validity runs out, huge jumps.
    "round_expires_on_a_time_jump": hdr()
    + submit(TRY, 0)
    + answer(LOCK, YES, count=7)
    + time_s(3_000_000_000),
    "extend_granted": hdr() + granted() + extend(0) + answer(LOCK, YES),
    "extend_after_validity_expired": hdr() + granted() + time_s(30) + extend(0),
    "slow_grant_little_validity": hdr(ttl=(0, 60), node=200)
    + submit(TRY, 0)
    + answer(LOCK, YES, count=7)
    + time_ms(55)
    + answer(LOCK, YES),
    "validity_used_up_below_min_validity": hdr(ttl=(1, 100), minv=9000, node=250)
    + submit(TRY, 0)
    + answer(LOCK, YES, count=7)
    + time_ms(100)
    + answer(LOCK, YES),
    "max_ttl_then_past_max_ttl": hdr(ttl=(3, 0), ttl2=(3, 5))
    + granted()
    + time_past_max_ttl(10)
    + extend(0)
    + release(0)
    + answer(LOCK, YES),
    # Dropped guards and cancelled calls.
    "dropped_lock_released_detached": hdr() + granted() + detach(0) + answer(LOCK, YES),
    "cancel_a_waiting_lock": hdr()
    + submit(LOCK_, 0)
    + answer(LOCK, NO)
    + answer(SUB, YES)
    + cancel(0)
    + answer(LOCK, YES),
    "cancel_in_flight_graceful": hdr(graceful=True)
    + submit(LOCK_, 1)
    + answer(0, YES)
    + cancel(0)
    + submit(TRY, 2)
    + answer(1, YES),
    # Waiting: timed retries, announcements, lines, fairness.
    "poll_mode_timed_retry_granted": hdr(poll=True, retries=3, delay=100, jitter=20)
    + submit(LOCK_, 0)
    + answer(LOCK, NO)
    + time_ms(130)
    + answer(LOCK, YES),
    "notify_wait_woken_by_turn": hdr(retries=3, delay=250, jitter=0)
    + submit(LOCK_, 0)
    + answer(LOCK, NO)
    + answer(SUB, YES)
    + canned(SUB, C_TURN)
    + answer(LOCK, YES),
    "notify_wait_woken_by_release_announcement": hdr(retries=3, delay=250, jitter=0)
    + submit(MANY, 0)
    + answer(LOCK, NO)
    + answer(SUB, YES)
    + canned(SUB, C_RELEASED_HOLDER, 0)
    + canned(SUB, C_RELEASED_HOLDER, 1)
    + answer(LOCK, YES),
    "notify_holder_expiry_then_grant": hdr(retries=1, delay=250)
    + submit(LOCK_, 0)
    + answer(LOCK, NO)
    + answer(SUB, NO)
    + time_ms(170)
    + answer(LOCK, YES),
    "local_release_hands_over": hdr(retries=3, delay=250)
    + granted()
    + submit(LOCK_, 0)
    + answer(LOCK, NO)
    + answer(SUB, YES)
    + release(0)
    + answer(LOCK, YES)
    + answer(LOCK, YES),
    "fair_waiters_two_clients_worth": hdr(fair=True, retries=3, delay=200)
    + submit(LOCK_, 0)
    + submit(LOCK_, 0)
    + submit(DEADLINE, 0, d=50)
    + answer(LOCK, SLOW)
    + answer(SUB, YES)
    + canned(SUB, C_TURN, 0)
    + canned(SUB, C_TURN, 1)
    + answer(LOCK, YES)
    + answer(LOCK, NO)
    + timer()
    + answer(LOCK, YES),
    "deadline_passes_while_taken": hdr(retries=3, delay=30)
    + submit(DEADLINE, 2, d=10)
    + answer(LOCK, NO)
    + timer()
    + answer(LOCK, NO)
    + timer()
    + answer(LOCK, NO)
    + time_ms(200),
    "deadline_now": hdr() + submit(DEADLINE, 0, d=0),
    "subscription_refused_noperm": hdr(retries=2, delay=100)
    + submit(LOCK_, 1)
    + answer(LOCK, NO)
    + answer(SUB, NO)
    + time_ms(120)
    + answer(LOCK, YES),
    # Handshakes: AUTH and SELECT gate the requests; wrong answers; amnesia; durability.
    "auth_select_gate_then_grant": hdr(password=True, user=True, db=True, cap=0)
    + submit(TRY, 0)
    + answer(LOCK, YES, count=1)
    + answer(LOCK, YES, count=1)
    + answer(LOCK, YES),
    "wrong_password_refused": hdr(password=True, retries=3)
    + submit(LOCK_, 0)
    + answer(LOCK, WRONG),
    "handshake_errors_and_bad_sha": hdr()
    + submit(TRY, 0)
    + answer(0, WRONG)
    + answer(1, ERR)
    + answer(2, YES),
    "amnesia_guard_uptime_zero": hdr(guard=True, extra=1000, graceful=True)
    + submit(TRY, 0)
    + answer(LOCK, RESTARTED),
    "one_server_under_three_names": hdr(graceful=True) + submit(TRY, 1) + answer(LOCK, SAME),
    "fencing_durable_grant": hdr(fencing=True, durable=True)
    + submit(TRY, 0)
    + answer(LOCK, YES)
    + answer(LOCK, YES)
    + answer(LOCK, YES)
    + release(0)
    + answer(LOCK, YES),
    "fencing_checks_durability": hdr(fencing=True, retries=0)
    + submit(MANY, 0)
    + answer(0, YES)
    + answer(1, SAME)
    + answer(2, SLOW)
    + answer(LOCK, YES)
    + answer(LOCK, YES),
    "fencing_draw_refused_cleanup": hdr(fencing=True, durable=True, graceful=True)
    + submit(TRY, 2)
    + answer(LOCK, YES)
    + answer(LOCK, NO),
    # The network: manual connects, failures, timeouts, partial writes, splits.
    "manual_connects": hdr(manual=0b111)
    + submit(TRY, 0)
    + connect(0)
    + connect(1, fail=True)
    + connect(2)
    + answer(LOCK, YES),
    "connect_timeouts_and_backoff": hdr(manual=0b111, ct=5, retries=3, delay=20)
    + submit(LOCK_, 0)
    + timer()
    + timer()
    + timer()
    + timer()
    + connect(LOCK)
    + answer(LOCK, YES),
    "partial_writes": hdr(cap=200)
    + submit(TRY, 0)
    + answer(LOCK, YES) * 30,
    "split_replies": hdr()
    + submit(TRY, 0)
    + answer(LOCK, YES, split=5)
    + release(0)
    + answer(LOCK, YES, split=2),
    # Away from the loop for 3 s while a release waits for a slow master: the stall clock
    # is shifted (the master is not closed for the client's absence), the round times out.
    "client_away_between_calls": hdr(st=124)
    + granted()
    + release(0)
    + answer(0, YES)
    + away(3000)
    + answer(LOCK, YES)
    + submit(TRY, 1)
    + away(500)
    + answer(LOCK, YES),
    "stall_closes_a_silent_master": hdr(st=2, retries=1)
    + submit(LOCK_, 0)
    + answer(0, YES)
    + time_ms(40)
    + timer()
    + time_ms(70)
    + answer(LOCK, YES),
    # Hostile bytes and every canned reply.
    "raw_hostile": hdr()
    + submit(TRY, 0)
    + raw(0, b"$9223372036854775807\r\n")
    + raw(1, b"+O\rK\r\n")
    + raw(2, b"*2\r\n:1\r\n")
    + raw(3, b"*3\r\n$7\r\nmessage\r\n$5\r\nother\r\n$0\r\n\r\n"),
    "canned_replies_everywhere": hdr(n=2)
    + submit(LOCK_, 0)
    + b"".join(canned(LOCK, r) for r in range(32))
    + b"".join(canned(SUB, r, 1) for r in range(32)),
    # BUG engine-fuzz-1 (STRICT_TIMERS in engine_body.rs): refused before its subscriptions
    # were confirmed (1 ms later), the waiter tries once more at the confirmation (untimed);
    # that attempt times out at 251 ms (seen at the step at 261 ms) and the waiter sleeps
    # until its timed retry planned at 100 ms: next_timer is 161 ms in the past after the
    # step, and the timed attempt follows at once.
    "strict_bug_1_overdue_wake": hdr(retries=3, delay=100, jitter=0, node=250)
    + submit(LOCK_, 0)
    + answer(LOCK, NO)
    + time_ms(1)
    + answer(SUB, YES)
    + time_ms(260),
    # The same, minimized by the `minimize` test from a mutation (retry delay 0).
    "strict_bug_1_minimized": bytes(
        [0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0]
        + [0, 1, 0, 8, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 10, 0, 0, 140, 0, 0, 1, 0, 10, 0, 1]
    ),
    # BUG engine-fuzz-2 (STRICT_CONNECTS): the subscription link's connect never completes
    # (manual connects), times out, backs off; the tick that reconnects it schedules no
    # timer for the new connect's timeout (8 ms): the next timer is the channel's linger,
    # 1.96 s later. (Minimized from a mutation; events: try_lock, lock, then jumps to the
    # next timer and try_locks.)
    "strict_bug_2_sub_connect_timer": bytes(
        [0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1]
        + [0, 11, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 11, 0, 11, 0, 11, 0, 11, 0, 11, 0]
    ),
    "unsolicited_reply_first": hdr() + submit(TRY, 0) + canned(LOCK, C_OK) + answer(LOCK, YES),
}


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
    print(f"wrote {len(SEEDS)} seeds to {OUT}")


if __name__ == "__main__":
    main()
