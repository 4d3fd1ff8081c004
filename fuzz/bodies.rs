//! Bodies of the fuzz targets, shared by `fuzz/fuzz_targets/*.rs` (libFuzzer) and by
//! `tests/fuzz_corpus.rs` (the normal test suite replays `fuzz/seeds/<target>/` through them),
//! so the targets cannot rot.
//!
//! Only `redlock_mux::resp` is used. Every body panics (asserts) on a property violation and
//! returns normally otherwise, whatever the input.
#![allow(dead_code)]

use redlock_mux::resp::{
    encode_command, encode_frame, parse, parse_with_attribute, Aggregate, AggregateKind, Arg,
    Error, Frame, Limits, Parser, Status,
};

type Parsed<'a> = Result<Status<(Frame<'a>, usize)>, Error>;

/// Small limits, so that fuzz inputs of a few hundred bytes can reach every limit.
pub const TIGHT: Limits = Limits {
    max_bulk_len: 16,
    max_elements: 8,
    max_depth: 4,
    max_line_len: 32,
};

/// No limits at all (depth is still capped at `HARD_MAX_DEPTH`): length arithmetic on
/// `$18446744073709551615` and the like must be checked, not overflow.
pub const HUGE: Limits = Limits {
    max_bulk_len: usize::MAX,
    max_elements: usize::MAX,
    max_depth: usize::MAX,
    max_line_len: usize::MAX,
};

/// Fuzzer-found inputs beyond this are not interesting and make the quadratic checks slow.
const MAX_INPUT: usize = 64 * 1024;

// ---------------------------------------------------------------------------------------
// Checks shared by the bodies.
// ---------------------------------------------------------------------------------------

/// `inner` is a sub-slice of `outer` (frames borrow from the part of the input they used).
fn assert_within(inner: &[u8], outer: &[u8], what: &str) {
    let (o, i) = (outer.as_ptr() as usize, inner.as_ptr() as usize);
    assert!(
        inner.is_empty() || (i >= o && i + inner.len() <= o + outer.len()),
        "{what} does not borrow from the consumed input"
    );
}

/// How many elements a walk of `agg` yields: maps and attributes count pairs.
fn walk_len(agg: &Aggregate<'_>) -> usize {
    match agg.kind() {
        AggregateKind::Map | AggregateKind::Attribute => agg.len().checked_mul(2).expect("len"),
        _ => agg.len(),
    }
}

/// Check one frame against `limits` (when given), walking every aggregate recursively.
/// `depth` is the nesting depth of `frame` itself if it is an aggregate (top level: 1).
/// Returns the number of frames visited.
fn check_frame(frame: &Frame<'_>, limits: Option<&Limits>, depth: usize, input: &[u8]) -> usize {
    // The hard bound keeps this recursion shallow whatever the parser does.
    assert!(
        depth <= Limits::HARD_MAX_DEPTH + 1,
        "walk deeper than HARD_MAX_DEPTH"
    );
    match *frame {
        Frame::Simple(s) | Frame::Error(s) => {
            assert!(
                !s.contains(&b'\r') && !s.contains(&b'\n'),
                "CR/LF in a line"
            );
            if let Some(l) = limits {
                assert!(s.len() <= l.max_line_len, "line over max_line_len");
            }
            assert_within(s, input, "simple");
        }
        Frame::Double(s) | Frame::BigNumber(s) => {
            assert!(!s.is_empty(), "empty double/big number");
            assert!(
                !s.contains(&b'\r') && !s.contains(&b'\n'),
                "CR/LF in a line"
            );
            if let Some(l) = limits {
                assert!(s.len() <= l.max_line_len, "line over max_line_len");
            }
            assert_within(s, input, "double/big number");
        }
        Frame::Bulk(s) | Frame::BulkError(s) => {
            if let Some(l) = limits {
                assert!(s.len() <= l.max_bulk_len, "bulk over max_bulk_len");
            }
            assert_within(s, input, "bulk");
        }
        Frame::Verbatim { format, text } => {
            assert_eq!(format.len(), 3, "verbatim format is not 3 bytes");
            if let Some(l) = limits {
                assert!(
                    text.len() + 4 <= l.max_bulk_len,
                    "verbatim over max_bulk_len"
                );
            }
            assert_within(format, input, "verbatim format");
            assert_within(text, input, "verbatim text");
        }
        Frame::Integer(_)
        | Frame::NullBulk
        | Frame::NullArray
        | Frame::Null
        | Frame::Boolean(_) => {}
        Frame::Aggregate(agg) => return check_aggregate(&agg, limits, depth, input),
    }
    1
}

fn check_aggregate(
    agg: &Aggregate<'_>,
    limits: Option<&Limits>,
    depth: usize,
    input: &[u8],
) -> usize {
    let want = walk_len(agg);
    assert!(
        depth <= Limits::HARD_MAX_DEPTH,
        "nesting over HARD_MAX_DEPTH"
    );
    if let Some(l) = limits {
        assert!(depth <= l.max_depth, "nesting over max_depth");
        assert!(want <= l.max_elements, "aggregate over max_elements");
    }
    assert_eq!(agg.is_empty(), want == 0);
    assert_within(agg.raw(), input, "aggregate body");
    let mut visited = 1;
    let mut n = 0;
    let mut it = agg.iter();
    let copy = it.clone();
    for el in &mut it {
        n += 1;
        assert!(n <= want, "walk yields more elements than len()");
        // Elements borrow from the aggregate's own body.
        visited += check_frame(&el, limits, depth + 1, agg.raw());
    }
    assert_eq!(n, want, "walk yields fewer elements than len()");
    assert!(it.next().is_none(), "iterator resumes after None");
    // A cloned iterator walks the same elements.
    assert!(copy.eq(agg.iter()), "cloned iterator differs");
    visited
}

/// Structural equality: aggregates are compared element by element (their raw bytes may
/// legitimately differ after canonical re-encoding).
fn deep_eq(a: &Frame<'_>, b: &Frame<'_>, depth: usize) -> bool {
    assert!(depth <= Limits::HARD_MAX_DEPTH + 1);
    match (a, b) {
        (Frame::Aggregate(x), Frame::Aggregate(y)) => agg_eq(x, y, depth),
        _ => a == b,
    }
}

fn agg_eq(x: &Aggregate<'_>, y: &Aggregate<'_>, depth: usize) -> bool {
    x.kind() == y.kind()
        && x.len() == y.len()
        && x.iter().count() == y.iter().count()
        && x.iter()
            .zip(y.iter())
            .all(|(p, q)| deep_eq(&p, &q, depth + 1))
}

// ---------------------------------------------------------------------------------------
// Target `parse`.
// ---------------------------------------------------------------------------------------

/// Arbitrary bytes: `parse` never panics; on `Complete`, `0 < consumed <= len`, the frame is
/// within the limits and borrows from `data[..consumed]`, every aggregate walks cleanly;
/// `Parser` and `parse_with_attribute` agree with `parse`; stricter limits never accept
/// something looser ones do not (limits: none, default, tight).
pub fn parse_body(data: &[u8]) {
    if data.len() > MAX_INPUT {
        return;
    }
    let mut results: Vec<Parsed<'_>> = Vec::with_capacity(3);
    for limits in [HUGE, Limits::default(), TIGHT] {
        let r = parse(data, &limits);
        match r {
            Ok(Status::Complete((frame, consumed))) => {
                assert!(consumed > 0, "Complete with nothing consumed");
                assert!(consumed <= data.len(), "consumed > len");
                let used = &data[..consumed];
                check_frame(&frame, Some(&limits), 1, used);
                // The frame does not depend on the bytes after it.
                assert_eq!(parse(used, &limits), r, "trailing bytes changed the frame");
                // Every strict prefix of a complete frame is incomplete.
                for cut in [0, consumed / 2, consumed - 1] {
                    let p = parse(&data[..cut], &limits);
                    assert!(
                        matches!(p, Ok(Status::Partial(_))),
                        "strict prefix {cut}/{consumed} gave {p:?}"
                    );
                }
            }
            Ok(Status::Partial(need)) => {
                assert!(need >= 1, "Partial(0)");
            }
            Err(e) => {
                assert!(!e.description().is_empty());
                let _ = e.to_string();
            }
        }

        // parse_with_attribute: same value and length, attribute (if any) walks cleanly.
        let wa = parse_with_attribute(data, &limits);
        match (&wa, &r) {
            (Ok(Status::Complete((attr, f, c))), Ok(Status::Complete((g, d)))) => {
                assert_eq!((f, c), (g, d), "parse_with_attribute differs from parse");
                if let Some(attr) = attr {
                    assert_eq!(attr.kind(), AggregateKind::Attribute);
                    check_aggregate(attr, None, 1, &data[..*c]);
                }
            }
            (Ok(Status::Partial(_)), Ok(Status::Partial(_))) => {}
            (Err(x), Err(y)) => assert_eq!(x, y, "parse_with_attribute error differs"),
            _ => panic!("parse_with_attribute gave {wa:?}, parse gave {r:?}"),
        }

        // A fresh resumable parser on the whole input gives the same result; so does the
        // same parser again (it starts afresh after Complete or an error), and after reset.
        let mut p = Parser::new(limits);
        assert_eq!(p.limits(), &limits);
        let first = p.parse(data);
        assert_eq!(first, r, "Parser {first:?} != parse {r:?}");
        if !matches!(first, Ok(Status::Partial(_))) {
            let again = p.parse(data);
            assert_eq!(again, r, "Parser reused {again:?} != {r:?}");
        }
        p.reset();
        let after_reset = p.parse(data);
        assert_eq!(after_reset, r, "Parser after reset differs");
        p.reset();
        assert_eq!(
            p.parse_with_attribute(data),
            wa,
            "Parser::parse_with_attribute differs"
        );

        results.push(r);
    }

    // Each limit set is stricter than the one before in every dimension: a stricter one may
    // turn a result into an error (or a Partial into an error), never accept differently.
    for pair in results.windows(2) {
        let (loose, strict) = (&pair[0], &pair[1]);
        match (loose, strict) {
            (_, Err(_)) => {}
            (Ok(Status::Complete(_)), Ok(Status::Complete(_))) => {
                assert_eq!(loose, strict, "stricter limits accepted a different frame")
            }
            (Ok(Status::Partial(_)), Ok(Status::Partial(_))) => {}
            _ => panic!("looser limits gave {loose:?}, stricter limits gave {strict:?}"),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Target `fragment`.
// ---------------------------------------------------------------------------------------

/// How a sequence of frames (a pipeline) ended.
#[derive(Debug, PartialEq)]
enum End {
    /// All input used by whole frames.
    Exhausted,
    /// The tail is a strict prefix of a frame.
    Partial,
    /// The next frame is invalid.
    Error(Error),
}

type WithAttr<'a> = (Option<Aggregate<'a>>, Frame<'a>, usize);

/// A `parse` result in the shape of a `parse_with_attribute` one (no attribute).
fn strip(r: Parsed<'_>) -> Result<Status<WithAttr<'_>>, Error> {
    r.map(|s| match s {
        Status::Complete((f, c)) => Status::Complete((None, f, c)),
        Status::Partial(n) => Status::Partial(n),
    })
}

/// Parse `input` as a pipeline, whole, with the stateless `parse_with_attribute`.
fn pipeline_whole<'a>(input: &'a [u8], limits: &Limits) -> (Vec<WithAttr<'a>>, End) {
    let mut frames = Vec::new();
    let mut pos = 0;
    loop {
        if pos == input.len() {
            return (frames, End::Exhausted);
        }
        match parse_with_attribute(&input[pos..], limits) {
            Ok(Status::Complete((a, f, c))) => {
                assert!(c > 0 && c <= input.len() - pos);
                frames.push((a, f, c));
                pos += c;
            }
            Ok(Status::Partial(_)) => return (frames, End::Partial),
            Err(e) => return (frames, End::Error(e)),
        }
    }
}

/// The first byte picks a chunk size (1 + low 5 bits), `Parser::parse_with_attribute`
/// instead of `Parser::parse` (bit 5), `reset()` before every call (bit 6) and tight limits
/// (bit 7). The rest is fed to a `Parser` in growing prefixes of that chunk size, frame after
/// frame; the frames, their lengths (and attributes) and the final error must be exactly
/// those of parsing the whole input with the stateless functions. Each intermediate result
/// must be exactly what the stateless function gives on the same bytes (the documented
/// contract of `Parser`), and each `Partial(n)` a true lower bound.
pub fn fragment_body(data: &[u8]) {
    if data.is_empty() || data.len() > MAX_INPUT {
        return;
    }
    let sel = data[0];
    let input = &data[1..];
    let chunk = 1 + (sel & 0x1f) as usize;
    let with_attr = sel & 0x20 != 0;
    let reset_each = sel & 0x40 != 0;
    let limits = if sel & 0x80 != 0 {
        TIGHT
    } else {
        Limits::default()
    };

    let (want, want_end) = pipeline_whole(input, &limits);

    let mut parser = Parser::new(limits);
    let mut got = 0; // frames matched so far
    let mut pos = 0; // start of the current frame in `input`
    let mut avail = 0; // bytes of `input` fed so far
    let mut partials: Vec<(usize, usize)> = Vec::new(); // (fed length, need) for this frame
    let end = loop {
        if pos == input.len() {
            break End::Exhausted;
        }
        if avail == pos {
            // Nothing of this frame fed yet: feed the first chunk.
            avail = (pos + chunk).min(input.len());
        }
        if reset_each {
            parser.reset();
        }
        let buf = &input[pos..avail];
        let (r, stateless) = if with_attr {
            (
                parser.parse_with_attribute(buf),
                parse_with_attribute(buf, &limits),
            )
        } else {
            (strip(parser.parse(buf)), strip(parse(buf, &limits)))
        };
        assert_eq!(r, stateless, "Parser differs from the stateless parse");
        match r {
            Ok(Status::Complete((a, f, c))) => {
                assert!(c > 0 && c <= buf.len(), "consumed {c} of {}", buf.len());
                assert!(got < want.len(), "chunked parse found an extra frame {f:?}");
                let (wa, wf, wc) = want[got];
                assert_eq!((f, c), (wf, wc), "frame {got} differs when chunked");
                if with_attr {
                    assert_eq!(a, wa, "attribute of frame {got} differs when chunked");
                }
                for &(fed, need) in &partials {
                    assert!(
                        fed + need <= c,
                        "Partial({need}) after {fed} bytes, but the frame was {c} bytes"
                    );
                }
                partials.clear();
                got += 1;
                pos += c;
                // More frames may already be fed: parse again before feeding more.
            }
            Ok(Status::Partial(need)) => {
                assert!(need >= 1, "Partial(0)");
                partials.push((buf.len(), need));
                if avail == input.len() {
                    break End::Partial;
                }
                avail = (avail + chunk).min(input.len());
            }
            Err(e) => break End::Error(e),
        }
    };
    assert_eq!(got, want.len(), "chunked parse found fewer frames");
    assert_eq!(end, want_end, "chunked parse ended differently");
}

// ---------------------------------------------------------------------------------------
// Target `roundtrip`.
// ---------------------------------------------------------------------------------------

fn encode(frame: &Frame<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    encode_frame(&mut out, frame);
    out
}

/// Every complete frame of the input (as a pipeline): `encode_frame` then `parse` gives an
/// equal frame using all the bytes, and re-encoding gives identical bytes. An attribute
/// re-encoded before its value comes back through `parse_with_attribute`. Then the input is
/// cut into command arguments, `encode_command` must produce the exact canonical bytes, and
/// parsing them back gives an array of bulk strings equal to the arguments.
pub fn roundtrip_body(data: &[u8]) {
    if data.len() > MAX_INPUT {
        return;
    }
    let limits = Limits::default();
    let mut pos = 0;
    while pos < data.len() {
        let (attr, frame, c) = match parse_with_attribute(&data[pos..], &limits) {
            Ok(Status::Complete(v)) => v,
            _ => break,
        };
        pos += c;

        let once = encode(&frame);
        match parse(&once, &limits) {
            Ok(Status::Complete((back, used))) => {
                assert_eq!(used, once.len(), "re-parse of {once:?} used {used} bytes");
                assert!(deep_eq(&frame, &back, 1), "{frame:?} came back as {back:?}");
                let twice = encode(&back);
                assert_eq!(once, twice, "re-encoding is not stable");
            }
            other => panic!("encoding of {frame:?} = {once:?} parsed as {other:?}"),
        }

        if let Some(attr) = attr {
            let mut both = encode(&Frame::Aggregate(attr));
            both.extend_from_slice(&once);
            match parse_with_attribute(&both, &limits) {
                Ok(Status::Complete((Some(a2), f2, used))) => {
                    assert_eq!(used, both.len());
                    assert!(agg_eq(&attr, &a2, 1), "attribute came back different");
                    assert!(deep_eq(&frame, &f2, 1), "value after attribute differs");
                }
                other => panic!("attribute + value {both:?} parsed as {other:?}"),
            }
        }
    }

    command_roundtrip(data);
}

/// Cut `data` into arguments: a tag byte, then for bytes (tag % 4 < 2) a length byte
/// (% 64) and that many bytes; for Int/Uint 8 little-endian bytes.
fn split_args(mut data: &[u8]) -> Vec<Arg<'_>> {
    let mut args = Vec::new();
    while let Some((&tag, rest)) = data.split_first() {
        data = rest;
        match tag % 4 {
            0 | 1 => {
                let Some((&n, rest)) = data.split_first() else {
                    break;
                };
                let n = (n as usize % 64).min(rest.len());
                args.push(Arg::Bytes(&rest[..n]));
                data = &rest[n..];
            }
            k => {
                let mut b = [0u8; 8];
                let n = data.len().min(8);
                b[..n].copy_from_slice(&data[..n]);
                data = &data[n..];
                args.push(if k == 2 {
                    Arg::Int(i64::from_le_bytes(b))
                } else {
                    Arg::Uint(u64::from_le_bytes(b))
                });
            }
        }
        if args.len() == 64 {
            break;
        }
    }
    args
}

fn arg_bytes(a: &Arg<'_>) -> Vec<u8> {
    match *a {
        Arg::Bytes(b) => b.to_vec(),
        Arg::Int(i) => i.to_string().into_bytes(),
        Arg::Uint(u) => u.to_string().into_bytes(),
    }
}

fn command_roundtrip(data: &[u8]) {
    let args = split_args(data);
    let expected: Vec<Vec<u8>> = args.iter().map(arg_bytes).collect();

    // The canonical encoding, built the slow way.
    let mut canonical = format!("*{}\r\n", args.len()).into_bytes();
    for a in &expected {
        canonical.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        canonical.extend_from_slice(a);
        canonical.extend_from_slice(b"\r\n");
    }

    // Appends to what the buffer already holds; a reused buffer gives the same bytes.
    let mut out = b"junk".to_vec();
    encode_command(&mut out, &args);
    assert_eq!(&out[..4], b"junk", "encode_command overwrote the buffer");
    assert_eq!(&out[4..], &canonical[..], "encode_command bytes differ");
    out.clear();
    encode_command(&mut out, &args);
    assert_eq!(
        out, canonical,
        "encode_command into a reused buffer differs"
    );

    let limits = Limits::default();
    match parse(&out, &limits) {
        Ok(Status::Complete((Frame::Aggregate(agg), used))) => {
            assert_eq!(used, out.len());
            assert_eq!(agg.kind(), AggregateKind::Array);
            assert_eq!(agg.len(), args.len());
            let mut n = 0;
            for (el, want) in agg.iter().zip(&expected) {
                assert_eq!(el, Frame::Bulk(want), "argument {n} differs");
                n += 1;
            }
            assert_eq!(n, args.len(), "command walk is short");
        }
        other => panic!("command {out:?} parsed as {other:?}"),
    }
}
