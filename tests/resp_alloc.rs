//! A counting global allocator proves that parsing (aggregate walks and `Parser` resumes
//! included) and encoding into a warm buffer allocate nothing.
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use redlock_mux::resp::{
    encode_command, encode_frame, parse, parse_with_attribute, Arg, Frame, Limits, Parser, Status,
};

struct Counting;

thread_local! {
    static ALLOCS: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: every call forwards to the system allocator unchanged; the only addition is a
// bump of a const-initialised thread-local counter, which never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.with(|c| c.set(c.get() + 1));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.with(|c| c.set(c.get() + 1));
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations made on this thread while running `f`.
fn allocations<R>(f: impl FnOnce() -> R) -> (usize, R) {
    let before = ALLOCS.with(Cell::get);
    let r = f();
    (ALLOCS.with(Cell::get) - before, r)
}

/// Walk every frame of a tree, touching every byte it borrows.
fn walk(f: &Frame<'_>) -> usize {
    match *f {
        Frame::Aggregate(a) => a.iter().map(|e| walk(&e)).sum::<usize>() + 1,
        Frame::Simple(s) | Frame::Error(s) | Frame::Bulk(s) => s.len(),
        _ => 1,
    }
}

const INPUTS: &[&[u8]] = &[
    b"+OK\r\n",
    b"$-1\r\n",
    b":1\r\n",
    b"_\r\n",
    b"-NOSCRIPT No matching script. Please use EVAL.\r\n",
    b"$3\r\nfooXY",
    b"$9223372036854775807\r\n",
    b"*3\r\n$3\r\nfoo\r\n%1\r\n+k\r\n*2\r\n:1\r\n,1.5\r\n~1\r\n#t\r\n",
    b"|1\r\n+ttl\r\n:3\r\n>2\r\n+message\r\n=6\r\ntxt:hi\r\n",
    b"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n",
];

#[test]
fn parse_and_encode_allocate_nothing() {
    let limits = Limits::default();
    let mut parser = Parser::new(limits);
    let mut out = Vec::with_capacity(4096);
    // Warm up anything lazy (thread-locals, formatting machinery) outside the count.
    let _ = parse(b"+OK\r\n", &limits);

    let (n, total) = allocations(|| {
        let mut total = 0usize;
        for input in INPUTS {
            if let Ok(Status::Complete((f, _))) = parse(input, &limits) {
                total += walk(&f);
            }
            if let Ok(Status::Complete((a, f, _))) = parse_with_attribute(input, &limits) {
                total += walk(&f) + a.map_or(0, |a| a.iter().count());
            }
            // Resume byte by byte.
            for k in 0..=input.len() {
                match parser.parse(&input[..k]) {
                    Ok(Status::Complete((f, _))) => total += walk(&f),
                    Ok(Status::Partial(m)) => total += m,
                    Err(e) => total += e.description().len(),
                }
            }
            parser.reset();
        }
        total
    });
    assert_eq!(n, 0, "parsing allocated {n} times");
    assert!(total > 0);

    let (n, _) = allocations(|| {
        for _ in 0..100 {
            out.clear();
            encode_command(
                &mut out,
                &[
                    Arg::from("SET"),
                    Arg::from("lock:inventory:42"),
                    Arg::from(&b"9f8e7d6c5b4a39281706f5e4d3c2b1a0"[..]),
                    Arg::from("NX"),
                    Arg::from("PX"),
                    Arg::Uint(30_000),
                    Arg::Int(-1),
                ],
            );
            for input in INPUTS {
                if let Ok(Status::Complete((f, _))) = parse(input, &limits) {
                    encode_frame(&mut out, &f);
                }
            }
        }
    });
    assert_eq!(n, 0, "encoding into a warm buffer allocated {n} times");
    assert!(out.starts_with(b"*7\r\n$3\r\nSET\r\n"));
}

/// The counter works: a fresh buffer does allocate.
#[test]
fn counter_sees_allocations() {
    let (n, v) = allocations(|| {
        let mut v = Vec::new();
        encode_command(&mut v, &[Arg::from("PING")]);
        v
    });
    assert!(n >= 1);
    assert_eq!(v, b"*1\r\n$4\r\nPING\r\n");
}
