//! Encode-then-parse round trips over generated commands and frames (seeded, bounded).
use redlock_mux::resp::{encode_command, encode_frame, parse, Arg, Frame, Limits, Parser, Status};

const SEED: u64 = 0x5eed_2e5b;

fn random_bytes(rng: &mut fastrand::Rng, max: usize) -> Vec<u8> {
    let n = rng.usize(0..=max);
    // Bias towards the protocol's own bytes to exercise binary safety.
    (0..n)
        .map(|_| match rng.u8(0..8) {
            0 => b'\r',
            1 => b'\n',
            2 => b'$',
            _ => rng.u8(..),
        })
        .collect()
}

enum OwnedArg {
    Bytes(Vec<u8>),
    Int(i64),
    Uint(u64),
}

#[test]
fn commands_round_trip() {
    let mut rng = fastrand::Rng::with_seed(SEED);
    let limits = Limits::default();
    let mut out = Vec::new();
    for _ in 0..2000 {
        let args: Vec<OwnedArg> = (0..rng.usize(0..8))
            .map(|_| match rng.u8(0..4) {
                0 => OwnedArg::Int(match rng.u8(0..3) {
                    0 => i64::MIN,
                    1 => i64::MAX,
                    _ => rng.i64(..),
                }),
                1 => OwnedArg::Uint(if rng.bool() {
                    u64::MAX
                } else {
                    rng.u64(..1000)
                }),
                _ => OwnedArg::Bytes(random_bytes(&mut rng, 40)),
            })
            .collect();
        let borrowed: Vec<Arg<'_>> = args
            .iter()
            .map(|a| match a {
                OwnedArg::Bytes(b) => Arg::Bytes(b),
                OwnedArg::Int(v) => Arg::Int(*v),
                OwnedArg::Uint(v) => Arg::Uint(*v),
            })
            .collect();
        out.clear();
        encode_command(&mut out, &borrowed);
        let Ok(Status::Complete((Frame::Aggregate(a), n))) = parse(&out, &limits) else {
            panic!("not an array: {:?}", String::from_utf8_lossy(&out));
        };
        assert_eq!(n, out.len());
        assert_eq!(a.len(), args.len());
        for (got, want) in a.iter().zip(&args) {
            let want = match want {
                OwnedArg::Bytes(b) => b.clone(),
                OwnedArg::Int(v) => v.to_string().into_bytes(),
                OwnedArg::Uint(v) => v.to_string().into_bytes(),
            };
            assert_eq!(got, Frame::Bulk(&want));
        }
    }
}

#[test]
fn command_exact_bytes() {
    let mut out = Vec::new();
    encode_command(&mut out, &[Arg::from("GET"), Arg::from(b"k")]);
    assert_eq!(out, b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n");
    out.clear();
    encode_command(
        &mut out,
        &[
            Arg::Int(-12),
            Arg::Int(0),
            Arg::Uint(u64::MAX),
            Arg::Int(i64::MIN),
            Arg::from(&b""[..]),
        ],
    );
    assert_eq!(
        out,
        b"*5\r\n$3\r\n-12\r\n$1\r\n0\r\n$20\r\n18446744073709551615\r\n$20\r\n-9223372036854775808\r\n$0\r\n\r\n"
    );
    out.clear();
    encode_command(&mut out, &[]);
    assert_eq!(out, b"*0\r\n");
    // Appends; never clears.
    encode_command(&mut out, &[Arg::Uint(7)]);
    assert_eq!(out, b"*0\r\n*1\r\n$1\r\n7\r\n");
}

/// Write a random valid frame (canonical form) into `out`.
fn gen_frame(rng: &mut fastrand::Rng, out: &mut Vec<u8>, depth: usize) {
    let leaf = depth >= 6 || rng.u8(0..3) != 0;
    if leaf {
        match rng.u8(0..13) {
            0 => {
                out.push(b'+');
                out.extend(
                    random_bytes(rng, 20)
                        .into_iter()
                        .filter(|b| !b"\r\n".contains(b)),
                );
                out.extend_from_slice(b"\r\n");
            }
            1 => {
                out.push(b'-');
                out.extend_from_slice(b"ERR something");
                out.extend_from_slice(b"\r\n");
            }
            2 => out.extend_from_slice(format!(":{}\r\n", rng.i64(..)).as_bytes()),
            3 => {
                let b = random_bytes(rng, 30);
                out.extend_from_slice(format!("${}\r\n", b.len()).as_bytes());
                out.extend_from_slice(&b);
                out.extend_from_slice(b"\r\n");
            }
            4 => out.extend_from_slice(b"$-1\r\n"),
            5 => out.extend_from_slice(b"*-1\r\n"),
            6 => out.extend_from_slice(b"_\r\n"),
            7 => out.extend_from_slice(if rng.bool() { b"#t\r\n" } else { b"#f\r\n" }),
            8 => {
                let d = [
                    "1.5", "-3", "inf", "-inf", "nan", "1e10", "0.000001", "-2.5E-7",
                ];
                out.extend_from_slice(format!(",{}\r\n", d[rng.usize(..d.len())]).as_bytes());
            }
            9 => out.extend_from_slice(format!("({}{}\r\n", rng.i64(..), rng.u64(..)).as_bytes()),
            10 => {
                let b = random_bytes(rng, 30);
                out.extend_from_slice(format!("!{}\r\n", b.len()).as_bytes());
                out.extend_from_slice(&b);
                out.extend_from_slice(b"\r\n");
            }
            11 => {
                let b = random_bytes(rng, 30);
                out.extend_from_slice(format!("={}\r\ntxt:", b.len() + 4).as_bytes());
                out.extend_from_slice(&b);
                out.extend_from_slice(b"\r\n");
            }
            _ => out.extend_from_slice(format!(":{}\r\n", rng.i64(-5..5)).as_bytes()),
        }
        return;
    }
    let n = rng.usize(0..5);
    let (t, items) = match rng.u8(0..4) {
        0 => (b'*', n),
        1 => (b'%', n * 2),
        2 => (b'~', n),
        _ => (b'>', n),
    };
    out.push(t);
    out.extend_from_slice(format!("{n}\r\n").as_bytes());
    for _ in 0..items {
        gen_frame(rng, out, depth + 1);
    }
}

#[test]
fn frames_round_trip() {
    let mut rng = fastrand::Rng::with_seed(SEED);
    let limits = Limits::default();
    let mut input = Vec::new();
    let mut out = Vec::new();
    let mut again = Vec::new();
    for _ in 0..3000 {
        input.clear();
        gen_frame(&mut rng, &mut input, 0);
        let Ok(Status::Complete((f, n))) = parse(&input, &limits) else {
            panic!(
                "generated frame refused: {:?}",
                String::from_utf8_lossy(&input)
            );
        };
        assert_eq!(n, input.len());
        out.clear();
        encode_frame(&mut out, &f);
        // Canonical input comes back byte for byte, and again after a second trip.
        assert_eq!(out, input, "{:?}", String::from_utf8_lossy(&input));
        let Ok(Status::Complete((g, m))) = parse(&out, &limits) else {
            panic!()
        };
        assert_eq!((g, m), (f, n));
        again.clear();
        encode_frame(&mut again, &g);
        assert_eq!(again, out);
        // The resumable parser agrees on a random split.
        let k = rng.usize(0..=input.len());
        let mut p = Parser::new(limits);
        assert_eq!(p.parse(&input[..k]), parse(&input[..k], &limits));
        assert_eq!(p.parse(&input), Ok(Status::Complete((f, n))));
    }
}

#[test]
fn hand_built_frames_encode() {
    let mut out = Vec::new();
    for (f, want) in [
        (Frame::Simple(b"OK"), &b"+OK\r\n"[..]),
        (Frame::Error(b"ERR x"), b"-ERR x\r\n"),
        (Frame::Integer(-1), b":-1\r\n"),
        (Frame::Integer(i64::MIN), b":-9223372036854775808\r\n"),
        (Frame::Bulk(b"a\r\nb"), b"$4\r\na\r\nb\r\n"),
        (Frame::NullBulk, b"$-1\r\n"),
        (Frame::NullArray, b"*-1\r\n"),
        (Frame::Null, b"_\r\n"),
        (Frame::Boolean(true), b"#t\r\n"),
        (Frame::Boolean(false), b"#f\r\n"),
        (Frame::Double(b"-inf"), b",-inf\r\n"),
        (Frame::BigNumber(b"123"), b"(123\r\n"),
        (Frame::BulkError(b"SYNTAX x"), b"!8\r\nSYNTAX x\r\n"),
        (
            Frame::Verbatim {
                format: b"txt",
                text: b"hi",
            },
            b"=6\r\ntxt:hi\r\n",
        ),
    ] {
        out.clear();
        encode_frame(&mut out, &f);
        assert_eq!(out, want);
        assert_eq!(
            parse(&out, &Limits::default()),
            Ok(Status::Complete((f, out.len())))
        );
    }
}

/// Attributes inside aggregates are dropped by `encode_frame` (the walk skips them).
#[test]
fn nested_attributes_are_dropped_on_encode() {
    let input = b"*2\r\n|1\r\n+a\r\n+b\r\n:1\r\n:2\r\n";
    let Ok(Status::Complete((f, _))) = parse(input, &Limits::default()) else {
        panic!()
    };
    let mut out = Vec::new();
    encode_frame(&mut out, &f);
    assert_eq!(out, b"*2\r\n:1\r\n:2\r\n");
}
