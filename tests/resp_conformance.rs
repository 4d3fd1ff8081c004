//! The parser's decisions, one table row each, and every row fed at every split point
//! through both the stateless `parse` and the resumable `Parser`.
use redlock_mux::resp::{
    parse, parse_with_attribute, AggregateKind, Error, Frame, Limits, Parser, Status,
};

/// An owned view of a frame, to write expected aggregates in the table.
#[derive(Debug, Clone, PartialEq)]
enum T {
    Simple(&'static [u8]),
    Err(&'static [u8]),
    Int(i64),
    Bulk(&'static [u8]),
    NullBulk,
    NullArray,
    Null,
    Bool(bool),
    Double(&'static [u8]),
    Big(&'static [u8]),
    BulkErr(&'static [u8]),
    Verbatim(&'static [u8], &'static [u8]),
    Agg(AggregateKind, Vec<T>),
}

/// Convert a parsed frame to a comparable tree (tests may allocate).
fn tree(f: &Frame<'_>) -> String {
    format!("{:?}", owned(f))
}

#[derive(Debug)]
#[allow(dead_code)]
enum O {
    Simple(Vec<u8>),
    Err(Vec<u8>),
    Int(i64),
    Bulk(Vec<u8>),
    NullBulk,
    NullArray,
    Null,
    Bool(bool),
    Double(Vec<u8>),
    Big(Vec<u8>),
    BulkErr(Vec<u8>),
    Verbatim(Vec<u8>, Vec<u8>),
    Agg(AggregateKind, Vec<O>),
}

fn owned(f: &Frame<'_>) -> O {
    match *f {
        Frame::Simple(s) => O::Simple(s.to_vec()),
        Frame::Error(s) => O::Err(s.to_vec()),
        Frame::Integer(v) => O::Int(v),
        Frame::Bulk(s) => O::Bulk(s.to_vec()),
        Frame::NullBulk => O::NullBulk,
        Frame::NullArray => O::NullArray,
        Frame::Null => O::Null,
        Frame::Boolean(b) => O::Bool(b),
        Frame::Double(s) => O::Double(s.to_vec()),
        Frame::BigNumber(s) => O::Big(s.to_vec()),
        Frame::BulkError(s) => O::BulkErr(s.to_vec()),
        Frame::Verbatim { format, text } => O::Verbatim(format.to_vec(), text.to_vec()),
        Frame::Aggregate(a) => {
            let v: Vec<O> = a.iter().map(|e| owned(&e)).collect();
            let want = match a.kind() {
                AggregateKind::Map | AggregateKind::Attribute => a.len() * 2,
                _ => a.len(),
            };
            assert_eq!(v.len(), want, "walk length matches the header");
            O::Agg(a.kind(), v)
        }
    }
}

fn expected_tree(t: &T) -> O {
    match t {
        T::Simple(s) => O::Simple(s.to_vec()),
        T::Err(s) => O::Err(s.to_vec()),
        T::Int(v) => O::Int(*v),
        T::Bulk(s) => O::Bulk(s.to_vec()),
        T::NullBulk => O::NullBulk,
        T::NullArray => O::NullArray,
        T::Null => O::Null,
        T::Bool(b) => O::Bool(*b),
        T::Double(s) => O::Double(s.to_vec()),
        T::Big(s) => O::Big(s.to_vec()),
        T::BulkErr(s) => O::BulkErr(s.to_vec()),
        T::Verbatim(f, s) => O::Verbatim(f.to_vec(), s.to_vec()),
        T::Agg(k, v) => O::Agg(*k, v.iter().map(expected_tree).collect()),
    }
}

#[derive(Debug)]
enum Want {
    /// The frame, and how many bytes it consumed.
    Frame(T, usize),
    /// A strict prefix of a valid frame, with the exact lower bound reported.
    Partial(usize),
    Err(Error),
}

use AggregateKind::{Array, Attribute, Map, Push, Set};
use Want::{Err as E, Frame as F, Partial as P};

fn arr(v: Vec<T>) -> T {
    T::Agg(Array, v)
}

/// Small limits for the limit rows.
const TIGHT: Limits = Limits {
    max_bulk_len: 10,
    max_elements: 4,
    max_depth: 2,
    max_line_len: 8,
};

fn table() -> Vec<(&'static [u8], Want, Limits)> {
    let d = Limits::default();
    let t = TIGHT;
    vec![
        // Simple strings and errors.
        (b"+OK\r\n", F(T::Simple(b"OK"), 5), d),
        (b"+\r\n", F(T::Simple(b""), 3), d),
        (b"+OK\r\n+next", F(T::Simple(b"OK"), 5), d),
        (
            b"-ERR unknown command\r\n",
            F(T::Err(b"ERR unknown command"), 22),
            d,
        ),
        (
            b"-NOSCRIPT No matching script\r\n",
            F(T::Err(b"NOSCRIPT No matching script"), 30),
            d,
        ),
        (b"+O\rK\r\n", E(Error::BadLineEnding), d),
        (b"+O\nK\r\n", E(Error::BadLineEnding), d),
        (b"-E\nR\r\n", E(Error::BadLineEnding), d),
        (b"+OK\n", E(Error::BadLineEnding), d),
        (b"+OK\r", P(1), d),
        (b"+OK", P(2), d),
        // Integers: optional '-', no '+', no leading zeros, no "-0", within i64.
        (b":1\r\n", F(T::Int(1), 4), d),
        (b":0\r\n", F(T::Int(0), 4), d),
        (b":-1\r\n", F(T::Int(-1), 5), d),
        (b":1000\r\n", F(T::Int(1000), 7), d),
        (b":9223372036854775807\r\n", F(T::Int(i64::MAX), 22), d),
        (b":-9223372036854775808\r\n", F(T::Int(i64::MIN), 23), d),
        (b":9223372036854775808\r\n", E(Error::IntegerOverflow), d),
        (b":-9223372036854775809\r\n", E(Error::IntegerOverflow), d),
        (
            b":99999999999999999999999\r\n",
            E(Error::IntegerOverflow),
            d,
        ),
        (b":007\r\n", E(Error::BadInteger), d),
        (b":00\r\n", E(Error::BadInteger), d),
        (b":-0\r\n", E(Error::BadInteger), d),
        (b":+1\r\n", E(Error::BadInteger), d),
        (b":\r\n", E(Error::BadInteger), d),
        (b":-\r\n", E(Error::BadInteger), d),
        (b": 1\r\n", E(Error::BadInteger), d),
        (b":1 \r\n", E(Error::BadInteger), d),
        (b":1x\r\n", E(Error::BadInteger), d),
        (b":1\n", E(Error::BadLineEnding), d),
        (b":1\rx", E(Error::BadLineEnding), d),
        // Bulk strings: checked CRLF after the data, canonical lengths.
        (b"$3\r\nfoo\r\n", F(T::Bulk(b"foo"), 9), d),
        (b"$0\r\n\r\n", F(T::Bulk(b""), 6), d),
        (b"$4\r\na\r\nb\r\n", F(T::Bulk(b"a\r\nb"), 10), d),
        (b"$3\r\nfooXY", E(Error::MissingBulkTerminator), d),
        (b"$3\r\nfoo\rX", E(Error::MissingBulkTerminator), d),
        (b"$3\r\nfoo\nX", E(Error::MissingBulkTerminator), d),
        (b"$3\r\nfoo", P(2), d),
        (b"$100\r\nab", P(100), d),
        (b"$-1\r\n", F(T::NullBulk, 5), d),
        (b"$-2\r\n", E(Error::BadLength), d),
        (b"$-10\r\n", E(Error::BadLength), d),
        (b"$-0\r\n", E(Error::BadInteger), d),
        (b"$ 3\r\nfoo\r\n", E(Error::BadInteger), d),
        (b"$3 \r\nfoo\r\n", E(Error::BadInteger), d),
        (b"$03\r\nfoo\r\n", E(Error::BadInteger), d),
        (b"$+3\r\nfoo\r\n", E(Error::BadInteger), d),
        (b"$\r\n", E(Error::BadInteger), d),
        (b"$3\nfoo\r\n", E(Error::BadLineEnding), d),
        // Nulls: RESP2 null bulk / null array / RESP3 null / streamed never confused.
        (b"*-1\r\n", F(T::NullArray, 5), d),
        (b"*-2\r\n", E(Error::BadLength), d),
        (b"_\r\n", F(T::Null, 3), d),
        (b"_x\r\n", E(Error::BadNull), d),
        (b"_\rx", E(Error::BadNull), d),
        (b"_ \r\n", E(Error::BadNull), d),
        (b"%-1\r\n", E(Error::BadLength), d),
        (b"~-1\r\n", E(Error::BadLength), d),
        (b">-1\r\n", E(Error::BadLength), d),
        (b"|-1\r\n", E(Error::BadLength), d),
        (b"!-1\r\n", E(Error::BadLength), d),
        (b"=-1\r\n", E(Error::BadLength), d),
        // Streamed RESP3 forms are rejected.
        (b"$?\r\n;4\r\nHell\r\n;0\r\n", E(Error::Unsupported), d),
        (b"*?\r\n:1\r\n.\r\n", E(Error::Unsupported), d),
        (b"%?\r\n", E(Error::Unsupported), d),
        (b"~?\r\n", E(Error::Unsupported), d),
        (b";4\r\nHell\r\n", E(Error::Unsupported), d),
        (b".\r\n", E(Error::Unsupported), d),
        // Booleans.
        (b"#t\r\n", F(T::Bool(true), 4), d),
        (b"#f\r\n", F(T::Bool(false), 4), d),
        (b"#x\r\n", E(Error::BadBoolean), d),
        (b"#tt\r\n", E(Error::BadBoolean), d),
        (b"#\r\n", E(Error::BadBoolean), d),
        (b"#T\r\n", E(Error::BadBoolean), d),
        // Doubles.
        (b",1.5\r\n", F(T::Double(b"1.5"), 6), d),
        (b",-3\r\n", F(T::Double(b"-3"), 5), d),
        (b",inf\r\n", F(T::Double(b"inf"), 6), d),
        (b",-inf\r\n", F(T::Double(b"-inf"), 7), d),
        (b",nan\r\n", F(T::Double(b"nan"), 6), d),
        // Redis before 7.2 formats doubles with the C library: `-nan`, `NAN`, `INF` occur.
        (b",-nan\r\n", F(T::Double(b"-nan"), 7), d),
        (b",NAN\r\n", F(T::Double(b"NAN"), 6), d),
        (b",-INF\r\n", F(T::Double(b"-INF"), 7), d),
        (b",nanx\r\n", E(Error::BadDouble), d),
        (b",+inf\r\n", E(Error::BadDouble), d),
        (b",1e10\r\n", F(T::Double(b"1e10"), 7), d),
        (b",-1.25E-3\r\n", F(T::Double(b"-1.25E-3"), 11), d),
        (
            b",1.0000000000000001e+300\r\n",
            F(T::Double(b"1.0000000000000001e+300"), 26),
            d,
        ),
        (b",\r\n", E(Error::BadDouble), d),
        (b",1.\r\n", E(Error::BadDouble), d),
        (b",.5\r\n", E(Error::BadDouble), d),
        (b",+1\r\n", E(Error::BadDouble), d),
        (b",1e\r\n", E(Error::BadDouble), d),
        (b",Inf\r\n", F(T::Double(b"Inf"), 6), d),
        (b",1 \r\n", E(Error::BadDouble), d),
        // Big numbers.
        (
            b"(3492890328409238509324850943850943825024385\r\n",
            F(T::Big(b"3492890328409238509324850943850943825024385"), 46),
            d,
        ),
        (b"(-12\r\n", F(T::Big(b"-12"), 6), d),
        (b"(12a\r\n", E(Error::BadBigNumber), d),
        (b"(\r\n", E(Error::BadBigNumber), d),
        (b"(-\r\n", E(Error::BadBigNumber), d),
        // Bulk errors and verbatim strings.
        (
            b"!21\r\nSYNTAX invalid syntax\r\n",
            F(T::BulkErr(b"SYNTAX invalid syntax"), 28),
            d,
        ),
        (b"!3\r\nabcX\r\n", E(Error::MissingBulkTerminator), d),
        (
            b"=15\r\ntxt:Some string\r\n",
            F(T::Verbatim(b"txt", b"Some string"), 22),
            d,
        ),
        (b"=4\r\nmkd:\r\n", F(T::Verbatim(b"mkd", b""), 10), d),
        (b"=3\r\ntxt\r\n", E(Error::BadVerbatim), d),
        (b"=5\r\ntxtxy\r\n", E(Error::BadVerbatim), d),
        (b"=5\r\ntxt:yZZ", E(Error::MissingBulkTerminator), d),
        // Aggregates.
        (b"*0\r\n", F(arr(vec![]), 4), d),
        (
            b"*2\r\n$3\r\nfoo\r\n:1\r\n",
            F(arr(vec![T::Bulk(b"foo"), T::Int(1)]), 17),
            d,
        ),
        (
            b"*3\r\n$-1\r\n*-1\r\n_\r\n",
            F(arr(vec![T::NullBulk, T::NullArray, T::Null]), 17),
            d,
        ),
        (
            b"%1\r\n+k\r\n:1\r\n",
            F(T::Agg(Map, vec![T::Simple(b"k"), T::Int(1)]), 12),
            d,
        ),
        (
            b"~2\r\n+a\r\n+b\r\n",
            F(T::Agg(Set, vec![T::Simple(b"a"), T::Simple(b"b")]), 12),
            d,
        ),
        (
            b">2\r\n+message\r\n+x\r\n",
            F(
                T::Agg(Push, vec![T::Simple(b"message"), T::Simple(b"x")]),
                18,
            ),
            d,
        ),
        (
            b"*2\r\n*1\r\n:1\r\n%0\r\n+tail",
            F(arr(vec![arr(vec![T::Int(1)]), T::Agg(Map, vec![])]), 16),
            d,
        ),
        (b"*2\r\n:1\r\n", P(3), d),
        (b"*3\r\n:1\r\n", P(6), d),
        (b"*2\r\n*2\r\n:1\r\n", P(6), d),
        (b"*2\r\n:1\r\n:x\r\n", E(Error::BadInteger), d),
        (b"*1\r\n$3\r\nfooXY", E(Error::MissingBulkTerminator), d),
        (b"", P(3), d),
        (b"?", E(Error::UnknownType(b'?')), d),
        (b"*1\r\nX\r\n", E(Error::UnknownType(b'X')), d),
        // Attributes attach to the next value and are never a reply or an element.
        (b"|1\r\n+key\r\n+val\r\n+OK\r\n", F(T::Simple(b"OK"), 21), d),
        (b"|0\r\n:7\r\n", F(T::Int(7), 8), d),
        (
            b"|1\r\n+a\r\n+b\r\n*1\r\n:1\r\n",
            F(arr(vec![T::Int(1)]), 20),
            d,
        ),
        (
            b"*2\r\n|1\r\n+a\r\n+b\r\n:1\r\n:2\r\n",
            F(arr(vec![T::Int(1), T::Int(2)]), 24),
            d,
        ),
        (
            b"%1\r\n|1\r\n+a\r\n*1\r\n|0\r\n:3\r\n+k\r\n+v\r\n",
            F(T::Agg(Map, vec![T::Simple(b"k"), T::Simple(b"v")]), 32),
            d,
        ),
        (b"|1\r\n+a\r\n+b\r\n", P(3), d),
        (b"*1\r\n|1\r\n+a\r\n+b\r\n", P(3), d),
        (
            b"|1\r\n+a\r\n+b\r\n|1\r\n+c\r\n+d\r\n+OK\r\n",
            E(Error::DanglingAttribute),
            d,
        ),
        (b"*1\r\n|0\r\n|0\r\n:1\r\n", E(Error::DanglingAttribute), d),
        // Limits, enforced as soon as the header (or the offending digit) is read.
        (b"$9223372036854775807\r\n", E(Error::BulkTooLong), d),
        (b"$99999999999999999999999999\r\n", E(Error::BulkTooLong), d),
        (b"$536870913\r\n", E(Error::BulkTooLong), d),
        (b"$536870912\r\n", P(536870914), d),
        (b"*1048577\r\n", E(Error::TooManyElements), d),
        (b"%524289\r\n", E(Error::TooManyElements), d),
        (b"*9223372036854775807\r\n", E(Error::TooManyElements), d),
        (b"$10\r\n0123456789\r\n", F(T::Bulk(b"0123456789"), 17), t),
        (b"$11\r\n", E(Error::BulkTooLong), t),
        (b"=11\r\n", E(Error::BulkTooLong), t),
        (
            b"*4\r\n:1\r\n:2\r\n:3\r\n:4\r\n",
            F(arr(vec![T::Int(1), T::Int(2), T::Int(3), T::Int(4)]), 20),
            t,
        ),
        (b"*5\r\n", E(Error::TooManyElements), t),
        (b"%3\r\n", E(Error::TooManyElements), t),
        (b"|3\r\n", E(Error::TooManyElements), t),
        (
            b"*1\r\n*1\r\n:1\r\n",
            F(arr(vec![arr(vec![T::Int(1)])]), 12),
            t,
        ),
        (b"*1\r\n*1\r\n*0\r\n", E(Error::TooDeep), t),
        (
            b"*1\r\n*1\r\n*-1\r\n",
            F(arr(vec![arr(vec![T::NullArray])]), 13),
            t,
        ),
        (b"*1\r\n|0\r\n*1\r\n|0\r\n:1\r\n", E(Error::TooDeep), t),
        (b"+12345678\r\n", F(T::Simple(b"12345678"), 11), t),
        (b"+123456789", E(Error::LineTooLong), t),
        (b"+123456789\r\n", E(Error::LineTooLong), t),
        (b",1.5000000\r\n", E(Error::LineTooLong), t),
        // The literal fast paths (`+OK`, `$-1`, `:0`, `:1`, `_`) and their near misses.
        (b":1\r\n:0\r\n", F(T::Int(1), 4), d),
        (b":0\r\n+OK\r\n", F(T::Int(0), 4), d),
        (b"$-1\r\n$-1\r\n", F(T::NullBulk, 5), d),
        (b"_\r\n_\r\n", F(T::Null, 3), d),
        (b"_\r\n:1", F(T::Null, 3), d),
        (b":2\r\n", F(T::Int(2), 4), d),
        (b":10\r\n", F(T::Int(10), 5), d),
        (b":3\r\n", F(T::Int(3), 4), d),
        (b":a\r\n", E(Error::BadInteger), d),
        (b":q\r\n", E(Error::BadInteger), d),
        (b";1\r\n", E(Error::Unsupported), d),
        (b":1\r\x8a", E(Error::BadLineEnding), d),
        (b":1\r\r", E(Error::BadLineEnding), d),
        (b":0\n\r", E(Error::BadLineEnding), d),
        (b"+OK\r\r", E(Error::BadLineEnding), d),
        (b"+OKK\r\n", F(T::Simple(b"OKK"), 6), d),
        (b"+Ok\r\n", F(T::Simple(b"Ok"), 5), d),
        (b"$-1\r\r", E(Error::BadLineEnding), d),
        (b"$-1\rX", E(Error::BadLineEnding), d),
        (b"$-1\r", P(1), d),
        (b"-OK\r\n", F(T::Err(b"OK"), 5), d),
        // ... under line limits too small for their lines (the general path decides).
        (b"+OK\r\n", E(Error::LineTooLong), lim_line(1)),
        (b"+OK\r\n", F(T::Simple(b"OK"), 5), lim_line(2)),
        (b"$-1\r\n", E(Error::LineTooLong), lim_line(1)),
        (b"$-1\r\n", F(T::NullBulk, 5), lim_line(2)),
        (b":1\r\n", E(Error::LineTooLong), lim_line(0)),
        (b":0\r\n", F(T::Int(0), 4), lim_line(1)),
        (b":1\r\n", F(T::Int(1), 4), lim_line(1)),
        (b"_\r\n", F(T::Null, 3), lim_line(0)),
        // Lines scanned a word at a time: control bytes other than CR/LF are content, a
        // bare CR or LF anywhere (first word, middle, the last partial word) is refused.
        (
            b"+\tA\x00\x0b\x0c\x0e\x01\x7f\x8d\x8a\xff\r\n",
            F(T::Simple(b"\tA\x00\x0b\x0c\x0e\x01\x7f\x8d\x8a\xff"), 14),
            d,
        ),
        (
            b"-ERR wrong number of arguments\r\n",
            F(T::Err(b"ERR wrong number of arguments"), 32),
            d,
        ),
        (b"+0123456789abcdef\rX", E(Error::BadLineEnding), d),
        (b"+0123456789abcde\nX\r\n", E(Error::BadLineEnding), d),
        (b"+0123456\x0b89\rabcdef\r\n", E(Error::BadLineEnding), d),
        (b"+0123456789\t\nab\r\n", E(Error::BadLineEnding), d),
        (b"+0123456789abcdefghij", P(2), d),
        (b"+0123456789abcdefghij\r", P(1), d),
        (b"+12345678\r\n", F(T::Simple(b"12345678"), 11), t),
        (b"+1234567\t\r\n", F(T::Simple(b"1234567\t"), 11), t),
        (b"+1234567\t9\r\n", E(Error::LineTooLong), t),
        (b"+12345678\n", E(Error::BadLineEnding), t),
        (b"+12345678\r\r", E(Error::BadLineEnding), t),
    ]
}

/// Default limits but for the line length.
fn lim_line(max_line_len: usize) -> Limits {
    Limits {
        max_line_len,
        ..Limits::default()
    }
}

#[test]
fn conformance_table() {
    let rows = table();
    assert!(rows.len() >= 40);
    for (input, want, limits) in &rows {
        let got = parse(input, limits);
        let ok = match (want, &got) {
            (Want::Frame(t, n), Ok(Status::Complete((f, m)))) => {
                format!("{:?}", expected_tree(t)) == tree(f) && n == m
            }
            (Want::Partial(n), Ok(Status::Partial(m))) => n == m,
            (Want::Err(e), Err(g)) => e == g,
            _ => false,
        };
        assert!(
            ok,
            "input {:?}: want {want:?}, got {got:?}",
            String::from_utf8_lossy(input)
        );
    }
}

/// A strict prefix is `Partial` (with a lower bound that holds) or the whole input's error.
#[test]
fn every_split_point() {
    for (input, _, limits) in table() {
        let whole = parse(input, &limits);
        let mut parser = Parser::new(limits);
        for k in 0..=input.len() {
            let prefix = &input[..k];
            let got = parse(prefix, &limits);
            let show = String::from_utf8_lossy(prefix);
            match (&whole, &got) {
                (_, Ok(Status::Partial(m))) => {
                    assert!(*m >= 1, "{show:?}");
                    if let Ok(Status::Complete((_, n))) = whole {
                        assert!(k + m <= n, "{show:?}: bound {m} past frame end {n}");
                    }
                }
                (Ok(Status::Complete((_, n))), _) if k >= *n => {
                    assert_eq!(got, whole, "{show:?}")
                }
                (Err(e), Err(g)) => assert_eq!(e, g, "{show:?}"),
                _ => panic!("prefix {show:?} gave {got:?}, whole gave {whole:?}"),
            }
            // The resumable parser, fed growing prefixes one byte at a time, agrees.
            assert_eq!(parser.parse(prefix), got, "Parser on {show:?}");
        }
        assert_eq!(parser.parse(input), whole);
    }
}

/// The resumable parser agrees with `parse` for other chunk sizes too.
#[test]
fn parser_chunked() {
    for (input, _, limits) in table() {
        for chunk in 2..8 {
            let mut parser = Parser::new(limits);
            let mut k = 0;
            loop {
                k = (k + chunk).min(input.len());
                let prefix = &input[..k];
                assert_eq!(parser.parse(prefix), parse(prefix, &limits));
                if k == input.len() {
                    break;
                }
            }
        }
    }
}

#[test]
fn attribute_is_returned_separately() {
    let d = Limits::default();
    let input = b"|1\r\n+ttl\r\n:3\r\n+OK\r\n";
    let Ok(Status::Complete((Some(attr), frame, n))) = parse_with_attribute(input, &d) else {
        panic!("expected an attribute");
    };
    assert_eq!(frame, Frame::Simple(b"OK"));
    assert_eq!(n, input.len());
    assert_eq!(attr.kind(), Attribute);
    assert_eq!(attr.len(), 1);
    assert_eq!(attr.raw(), b"+ttl\r\n:3\r\n");
    let walked: Vec<_> = attr.iter().collect();
    assert_eq!(walked, vec![Frame::Simple(b"ttl"), Frame::Integer(3)]);
    let mut p = Parser::default();
    assert_eq!(p.parse_with_attribute(&input[..10]), Ok(Status::Partial(6)));
    assert_eq!(
        p.parse_with_attribute(input),
        parse_with_attribute(input, &d)
    );
    assert_eq!(
        parse_with_attribute(b"+OK\r\n", &d),
        Ok(Status::Complete((None, Frame::Simple(b"OK"), 5)))
    );
}

/// Nesting up to the hard limit is walked without recursion; one more level is refused.
#[test]
fn deep_nesting_at_the_limit() {
    let deep = Limits {
        max_depth: Limits::HARD_MAX_DEPTH,
        ..Limits::default()
    };
    let mut input = Vec::new();
    for _ in 0..Limits::HARD_MAX_DEPTH {
        input.extend_from_slice(b"*1\r\n");
    }
    input.extend_from_slice(b":1\r\n");
    let Ok(Status::Complete((mut f, n))) = parse(&input, &deep) else {
        panic!("depth {} refused", Limits::HARD_MAX_DEPTH);
    };
    assert_eq!(n, input.len());
    let mut levels = 0;
    while let Frame::Aggregate(a) = f {
        levels += 1;
        f = a.iter().next().unwrap();
    }
    assert_eq!(levels, Limits::HARD_MAX_DEPTH);
    assert_eq!(f, Frame::Integer(1));
    let mut parser = Parser::new(deep);
    for k in 0..input.len() {
        assert!(parser.parse(&input[..k]).unwrap().is_partial());
    }
    assert_eq!(parser.parse(&input), parse(&input, &deep));
    // The default depth limit refuses it; one level past the hard cap is refused too.
    assert_eq!(parse(&input, &Limits::default()), Err(Error::TooDeep));
    let mut deeper = b"*1\r\n".to_vec();
    deeper.extend_from_slice(&input);
    let unbounded = Limits {
        max_depth: usize::MAX,
        ..deep
    };
    assert_eq!(parse(&deeper, &unbounded), Err(Error::TooDeep));
    assert_eq!(Parser::new(unbounded).parse(&deeper), Err(Error::TooDeep));
}

/// Huge headers fail at once, long before their data could arrive.
#[test]
fn huge_headers_rejected_at_once() {
    let d = Limits::default();
    assert_eq!(parse(b"*4294967296\r\n", &d), Err(Error::TooManyElements));
    assert_eq!(parse(b"*1048577", &d), Err(Error::TooManyElements));
    assert_eq!(parse(b"$9223372036854775807", &d), Err(Error::BulkTooLong));
    assert_eq!(parse(b"$536870913", &d), Err(Error::BulkTooLong));
    let huge = Limits {
        max_bulk_len: usize::MAX,
        max_elements: usize::MAX,
        ..d
    };
    // Even without limits, length arithmetic is checked.
    assert_eq!(
        parse(b"$18446744073709551615\r\n", &huge),
        Err(Error::BulkTooLong)
    );
    assert_eq!(
        parse(b"$18446744073709551616", &huge),
        Err(Error::BulkTooLong)
    );
    assert!(parse(b"*18446744073709551615\r\n", &huge)
        .unwrap()
        .is_partial());
    assert!(parse(b"%9223372036854775807\r\n", &huge)
        .unwrap()
        .is_partial());
    // A long line without CRLF is refused as soon as it passes the limit.
    let long = vec![b'a'; 64 * 1024 + 2];
    let mut line = b"+".to_vec();
    line.extend_from_slice(&long[..64 * 1024]);
    assert!(parse(&line, &d).unwrap().is_partial());
    line.push(b'a');
    assert_eq!(parse(&line, &d), Err(Error::LineTooLong));
}

/// A long line that arrives in small pieces is scanned once by the `Parser`; results match.
#[test]
fn parser_resumes_long_lines_and_aggregates() {
    let d = Limits::default();
    let mut input = b"*1000\r\n".to_vec();
    for i in 0..1000 {
        input.extend_from_slice(format!("+{}\r\n", "x".repeat(i % 50)).as_bytes());
    }
    let mut parser = Parser::default();
    for k in (0..input.len()).step_by(3) {
        assert_eq!(parser.parse(&input[..k]), parse(&input[..k], &d));
    }
    assert_eq!(parser.parse(&input), parse(&input, &d));
    let Ok(Status::Complete((Frame::Aggregate(a), _))) = parser.parse(&input) else {
        panic!()
    };
    assert_eq!(a.iter().count(), 1000);
}

#[test]
fn errors_describe_themselves() {
    for e in [
        Error::UnknownType(b'x'),
        Error::BadLineEnding,
        Error::BadInteger,
        Error::IntegerOverflow,
        Error::BadLength,
        Error::MissingBulkTerminator,
        Error::BadBoolean,
        Error::BadDouble,
        Error::BadBigNumber,
        Error::BadNull,
        Error::BadVerbatim,
        Error::BulkTooLong,
        Error::TooManyElements,
        Error::TooDeep,
        Error::LineTooLong,
        Error::Unsupported,
        Error::DanglingAttribute,
    ] {
        assert!(!e.to_string().is_empty());
        assert_ne!(e.description(), "resp error");
    }
}

/// Random token soups under several limit sets: the fast paths of `parse` agree with the
/// general path (`parse_with_attribute`) and with `Parser`, and every prefix is `Partial`
/// or fails with the whole input's error.
#[test]
fn random_inputs_agree_and_split_consistently() {
    const TOKENS: &[&[u8]] = &[
        b"+",
        b"-",
        b":",
        b"$",
        b"*",
        b"%",
        b"~",
        b">",
        b"|",
        b"_",
        b"#",
        b",",
        b"(",
        b"!",
        b"=",
        b";",
        b".",
        b"?",
        b"t",
        b"f",
        b"0",
        b"1",
        b"2",
        b"9",
        b"00",
        b"-1",
        b"\r\n",
        b"\r",
        b"\n",
        b" ",
        b"x",
        b"OK",
        b"inf",
        b"e5",
        b".5",
        b"txt:",
        b"123456789",
        b"9223372036854775807",
        b"18446744073709551616",
        b"*1\r\n",
        b"$3\r\nfoo\r\n",
        b":1\r\n",
        b"|1\r\n",
        b"%1\r\n",
        b"+OK\r\n",
        b"$-1\r\n",
        b"_\r\n",
    ];
    let limit_sets = [
        Limits::default(),
        TIGHT,
        Limits {
            max_line_len: 0,
            ..TIGHT
        },
        Limits {
            max_line_len: 1,
            ..TIGHT
        },
        Limits {
            max_line_len: 2,
            max_bulk_len: 3,
            max_elements: 1,
            max_depth: 1,
        },
        Limits {
            max_line_len: 19,
            max_depth: 0,
            ..Limits::default()
        },
    ];
    let mut rng = fastrand::Rng::with_seed(0x00c0_ffee);
    let mut input = Vec::new();
    for round in 0..rounds() {
        input.clear();
        for _ in 0..rng.usize(1..10) {
            input.extend_from_slice(TOKENS[rng.usize(..TOKENS.len())]);
        }
        let limits = limit_sets[round % limit_sets.len()];
        let whole = parse(&input, &limits);
        let general = parse_with_attribute(&input, &limits).map(|s| match s {
            Status::Complete((_, f, n)) => Status::Complete((f, n)),
            Status::Partial(n) => Status::Partial(n),
        });
        let show = String::from_utf8_lossy(&input);
        assert_eq!(whole, general, "{show:?} under {limits:?}");
        let mut parser = Parser::new(limits);
        for k in 0..=input.len() {
            let got = parse(&input[..k], &limits);
            match (&whole, &got) {
                (_, Ok(Status::Partial(m))) => {
                    if let Ok(Status::Complete((_, n))) = whole {
                        assert!(k + m <= n, "{show:?}[..{k}]");
                    }
                }
                (Ok(Status::Complete((_, n))), _) if k >= *n => assert_eq!(got, whole),
                (Err(e), Err(g)) => assert_eq!(e, g, "{show:?}[..{k}] under {limits:?}"),
                _ => panic!("{show:?}[..{k}] gave {got:?}, whole {whole:?} under {limits:?}"),
            }
            assert_eq!(parser.parse(&input[..k]), got, "Parser {show:?}[..{k}]");
        }
    }
}

/// What a `+` or `-` line must give, one byte at a time: the reference for the word-at-a-time
/// scan (partial sizes included: 2 while content is arriving, 1 after the CR).
fn reference_line(input: &[u8], max_line_len: usize) -> Result<Status<(Frame<'_>, usize)>, Error> {
    let mut i = 1;
    loop {
        let Some(&b) = input.get(i) else {
            return Ok(Status::Partial(2));
        };
        match b {
            b'\r' => break,
            b'\n' => return Err(Error::BadLineEnding),
            // Content byte number `i` (from 1) past the limit.
            _ if i > max_line_len => return Err(Error::LineTooLong),
            _ => i += 1,
        }
    }
    match input.get(i + 1) {
        None => Ok(Status::Partial(1)),
        Some(b'\n') => {
            let s = &input[1..i];
            let f = if input[0] == b'+' {
                Frame::Simple(s)
            } else {
                Frame::Error(s)
            };
            Ok(Status::Complete((f, i + 2)))
        }
        Some(_) => Err(Error::BadLineEnding),
    }
}

/// Random simple and error lines (0 to 80 content bytes, CR/LF and other control bytes
/// sprinkled at random, every length near a word boundary, random line limits) against
/// the byte-at-a-time reference, whole, at every prefix, and through a `Parser` fed in
/// random chunks.
#[test]
fn line_scan_matches_a_byte_loop() {
    const BYTES: &[u8] = b"\r\n\t\x00\x0b\x0c\x0e\x01\x7f\x80\x8a\x8d\x8e\xffaZ09 ";
    let mut rng = fastrand::Rng::with_seed(0x5a4a_0001);
    let mut input = Vec::new();
    for round in 0..rounds() {
        input.clear();
        input.push(if rng.bool() { b'+' } else { b'-' });
        let len = rng.usize(0..80);
        // Mostly plain text with rare control bytes, sometimes a soup of them.
        let soup = round % 4 == 0;
        for _ in 0..len {
            input.push(if soup || rng.u8(..) < 8 {
                BYTES[rng.usize(..BYTES.len())]
            } else {
                rng.u8(0x20..0x7f)
            });
        }
        if rng.u8(..) < 200 {
            input.extend_from_slice(b"\r\n");
        }
        if rng.bool() {
            input.extend_from_slice(b"+OK\r\n");
        }
        let limits = match round % 3 {
            0 => Limits::default(),
            _ => lim_line(rng.usize(0..90)),
        };
        let show = String::from_utf8_lossy(&input);
        for k in 0..=input.len() {
            let want = reference_line(&input[..k], limits.max_line_len);
            let want = match want {
                // The reference has no notion of the empty input.
                _ if k == 0 => parse(&[], &limits),
                w => w,
            };
            assert_eq!(
                parse(&input[..k], &limits),
                want,
                "{show:?}[..{k}] {limits:?}"
            );
        }
        let whole = parse(&input, &limits);
        let mut parser = Parser::new(limits);
        let mut k = 0;
        while k < input.len() {
            k = (k + rng.usize(1..12)).min(input.len());
            assert_eq!(
                parser.parse(&input[..k]),
                parse(&input[..k], &limits),
                "{show:?}[..{k}]"
            );
        }
        assert_eq!(parser.parse(&input), whole, "{show:?}");
    }
}

/// `RESP_ROUNDS` raises the random round count for a longer local run.
fn rounds() -> usize {
    std::env::var("RESP_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000)
}
