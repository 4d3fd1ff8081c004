//! `redlock list [PATTERN]`: the locks on the masters. Each master is scanned (`SCAN` with
//! `MATCH` and `TYPE string`, bounded in keys and in time, never `KEYS`) for keys whose
//! value is one of this crate's tokens; then every resource found is inspected on every
//! master at once (the library's `inspect`, through one shared client).

use std::collections::BTreeSet;
use std::io::{self, Write};
use std::time::{Duration, Instant};

use clap::Args;
use redlock_mux::resp::Arg;
use redlock_mux::{Inspection, MasterSpec};

use crate::common::{cross_slot, exit, say, CROSS_SLOT_HINT};
use crate::conn::{io_words, tls_setup, Master, Tls, Val};
use crate::status::{master_json, ttl_text};
use crate::{duration, MasterArgs};

pub const AFTER_HELP: &str = "\
Scans every master at once with SCAN (MATCH PATTERN, COUNT --count, TYPE string), never
KEYS: about --max-keys keys per master at most (COUNT is a hint to the master: a page may
hold a few more) and --timeout in all. The keys this crate
reserves (redlock-mux:*) are skipped; a key is a lock when its value is one of this
crate's tokens (32 hex digits, marked or not by a waiter). Every resource found is then
inspected on every master (as `redlock status`): its holder's fingerprint (the first 16
hex digits of the token, never the whole token), on how many masters and with which TTL
(one per master, in --masters order: - no key, ? no answer), whether a quorum holds it,
how many wait in its line, its fencing counter.
PATTERN is a Redis glob (default *: every key). A scan cut short by --max-keys or
--timeout says so: the list may then be incomplete.

Exit status:
  0    every master was scanned to the end and answered
  1    some master did not answer, or a scan was cut short (the list may be incomplete)
  64   usage or configuration error
  71   the output could not be written (a full disk, say; not a closed pipe)";

#[derive(Args, Debug)]
pub struct ListArgs {
    #[command(flatten)]
    masters: MasterArgs,
    /// Keys a master may return per SCAN call (its COUNT hint).
    #[arg(long, value_name = "N", default_value_t = 1000)]
    count: u32,
    /// Keys scanned per master at most.
    #[arg(long, value_name = "N", default_value_t = 100_000)]
    max_keys: u64,
    /// The whole scan's bound (each master's connect included).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = duration)]
    timeout: Duration,
    /// Print one JSON object on stdout instead of the table.
    #[arg(long)]
    json: bool,
    /// Only keys matching this Redis glob pattern (SCAN MATCH).
    #[arg(value_name = "PATTERN", default_value = "*")]
    pattern: String,
}

/// What scanning one master found.
struct Scan {
    /// Lock keys (resources) found.
    locks: Vec<Vec<u8>>,
    /// Keys the master returned.
    scanned: u64,
    /// Scanned to the end (cursor 0).
    complete: bool,
    /// Why it stopped early: an error, or the bound it reached.
    stopped: Option<String>,
}

/// One of this crate's lock values: a token (32 lowercase hex digits), marked or not.
fn is_lock_value(v: &[u8]) -> bool {
    let token = match v.len() {
        33 if v[32] == b'+' => &v[..32],
        32 => v,
        _ => return false,
    };
    token
        .iter()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
}

fn scan(spec: &MasterSpec, args: &ListArgs, deadline: Instant, tls: &Tls) -> Scan {
    let mut found = Scan {
        locks: Vec::new(),
        scanned: 0,
        complete: false,
        stopped: None,
    };
    // A read or write that runs into the deadline is the scan's bound, not a master's
    // fault: said as such.
    let words = |e: &io::Error| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut if Instant::now() >= deadline => {
            format!(
                "stopped at --timeout {}",
                humantime::format_duration(args.timeout)
            )
        }
        _ => io_words(e, args.timeout),
    };
    let mut master = match Master::open(spec, deadline, tls) {
        Ok(m) => m,
        Err(e) => {
            found.stopped = Some(words(&e));
            return found;
        }
    };
    // A cluster master: every shard primary, one after the other (--max-keys and
    // --timeout for them all).
    for node in 0..master.nodes() {
        if let Err(why) = scan_node(&mut master, node, args, deadline, &mut found) {
            found.stopped = Some(match master.node_name(node) {
                Some(name) => format!("shard {name}: {}", why.text(&words)),
                None => why.text(&words),
            });
            return found;
        }
    }
    found.complete = true;
    found
}

/// Why a scan stopped early.
enum Stop {
    Io(io::Error),
    Said(String),
}

impl Stop {
    fn text(self, words: &dyn Fn(&io::Error) -> String) -> String {
        match self {
            Stop::Io(e) => words(&e),
            Stop::Said(s) => s,
        }
    }
}

/// Scan one node of `master` (the server, or one shard primary) to the end.
fn scan_node(
    master: &mut Master,
    node: usize,
    args: &ListArgs,
    deadline: Instant,
    found: &mut Scan,
) -> Result<(), Stop> {
    let mut cursor = b"0".to_vec();
    loop {
        if found.scanned >= args.max_keys {
            return Err(Stop::Said(format!(
                "stopped at --max-keys {}",
                args.max_keys
            )));
        }
        // No page asks for more than the keys left to --max-keys (COUNT is a hint: a page
        // may hold a few more).
        let count = u64::from(args.count).min(args.max_keys - found.scanned);
        let page = master.node(node).map_err(Stop::Io)?.pipeline(&[vec![
            Arg::from("SCAN"),
            Arg::Bytes(&cursor),
            Arg::from("MATCH"),
            Arg::Bytes(args.pattern.as_bytes()),
            Arg::from("COUNT"),
            Arg::Uint(count),
            Arg::from("TYPE"),
            Arg::from("string"),
        ]]);
        let (next, keys) = match page.as_deref() {
            Ok([Val::Array(page)]) => match page.as_slice() {
                [Val::Bulk(Some(next)), Val::Array(keys)] => (next.clone(), keys.clone()),
                _ => return Err(Stop::Said(format!("unexpected SCAN reply: {page:?}"))),
            },
            Ok([Val::Error(e)]) => return Err(Stop::Said(format!("SCAN refused: {e}"))),
            Ok(other) => return Err(Stop::Said(format!("unexpected SCAN reply: {other:?}"))),
            Err(e) => return Err(Stop::Io(io::Error::new(e.kind(), e.to_string()))),
        };
        let names: Vec<&[u8]> = keys
            .iter()
            .filter_map(|k| match k {
                Val::Bulk(Some(k)) => Some(k.as_slice()),
                _ => None,
            })
            .filter(|k| !k.starts_with(redlock_mux::scripts::RESERVED_PREFIX))
            .collect();
        found.scanned += keys.len() as u64;
        if !names.is_empty() {
            // Keyed: on a cluster, a key whose slot moved since the scan is asked where it
            // lives now.
            let gets: Vec<(&[u8], Vec<Arg<'_>>)> = names
                .iter()
                .map(|k| (*k, vec![Arg::from("GET"), Arg::Bytes(k)]))
                .collect();
            let values = master.keyed(&gets).map_err(Stop::Io)?;
            for (k, v) in names.iter().zip(values) {
                if matches!(v, Val::Bulk(Some(ref v)) if is_lock_value(v)) {
                    found.locks.push(k.to_vec());
                }
            }
        }
        if next == b"0" {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(Stop::Said(format!(
                "stopped at --timeout {}",
                humantime::format_duration(args.timeout)
            )));
        }
        cursor = next;
    }
}

/// Resources inspected per batch: their rounds go out together, well below the number of
/// requests a master may have in flight.
const BATCH: usize = 256;

pub fn main(args: ListArgs) -> u8 {
    let urls = args.masters.urls();
    if urls.is_empty() {
        say!("no masters: pass --masters URLS or set REDLOCK_MASTERS");
        return exit::USAGE;
    }
    if args.count == 0 || args.max_keys == 0 {
        say!("--count and --max-keys must be above zero");
        return exit::USAGE;
    }
    let mut specs = Vec::with_capacity(urls.len());
    for url in &urls {
        match MasterSpec::parse(url) {
            Ok(s) => specs.push(s),
            Err(e) => {
                say!("bad configuration: {e}");
                return exit::USAGE;
            }
        }
    }
    let tls = match tls_setup(&args.masters, &specs) {
        Ok(t) => t,
        Err(e) => {
            say!("bad configuration: {e}");
            return exit::USAGE;
        }
    };
    let shared = match args
        .masters
        .builder()
        .connect_timeout(args.timeout)
        .build_shared()
    {
        Ok(c) => c,
        Err(e) => {
            say!("bad configuration: {e}");
            return exit::USAGE;
        }
    };
    let deadline = Instant::now() + args.timeout;
    let (tls, args_ref) = (&tls, &args);
    let scans: Vec<Scan> = std::thread::scope(|s| {
        let each: Vec<_> = specs
            .iter()
            .map(|spec| s.spawn(move || scan(spec, args_ref, deadline, tls)))
            .collect();
        each.into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| Scan {
                    locks: Vec::new(),
                    scanned: 0,
                    complete: false,
                    stopped: Some("the scan panicked".into()),
                })
            })
            .collect()
    });
    let resources: BTreeSet<Vec<u8>> = scans.iter().flat_map(|s| s.locks.clone()).collect();
    let mut locks: Vec<Inspection> = Vec::with_capacity(resources.len());
    let resources: Vec<Vec<u8>> = resources.into_iter().collect();
    for batch in resources.chunks(BATCH) {
        let pending: Vec<_> = batch.iter().map(|r| shared.inspect(r)).collect();
        for p in pending {
            match p.wait() {
                // Released since the scan: no longer a lock (unless a cluster master could
                // not look: then it stays listed, its holder unknown).
                Ok(i)
                    if i.holder().is_none()
                        && !i.masters().iter().any(|m| cross_slot(m.outcome())) => {}
                Ok(i) => locks.push(i),
                Err(e) => {
                    say!("{e}");
                    return exit::OSERR;
                }
            }
        }
    }
    let complete = scans.iter().all(|s| s.complete)
        && locks
            .iter()
            .all(|i| i.masters().iter().all(|m| m.answered()));
    let mut out = io::BufWriter::new(io::stdout().lock());
    let written = if args.json {
        writeln!(out, "{}", json(&specs, &scans, &locks, complete))
    } else {
        print_table(&mut out, &specs, &scans, &locks)
    }
    .and_then(|()| out.flush());
    match written {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {}
        Err(e) => {
            say!("cannot write the list: {e}");
            return exit::OSERR;
        }
    }
    if locks
        .iter()
        .any(|i| i.masters().iter().any(|m| cross_slot(m.outcome())))
    {
        say!("{CROSS_SLOT_HINT}");
    }
    for (spec, scan) in specs.iter().zip(&scans) {
        if let Some(why) = &scan.stopped {
            say!(
                "{spec}: {why} after {} keys: the list may be incomplete",
                scan.scanned
            );
        }
    }
    if complete {
        exit::OK
    } else {
        exit::CONFLICT
    }
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn print_table(
    out: &mut impl Write,
    specs: &[MasterSpec],
    scans: &[Scan],
    locks: &[Inspection],
) -> io::Result<()> {
    let scanned: u64 = scans.iter().map(|s| s.scanned).sum();
    // How far the scans went: every master to the end, or not (down, refused, a bound
    // reached; stderr says why per master). "0 keys scanned on 3 masters" must not be
    // read off masters that refused the scan.
    let whole = scans.iter().filter(|s| s.complete).count();
    let reach = if whole == specs.len() {
        format!("{scanned} keys scanned on {} masters", specs.len())
    } else {
        format!(
            "{scanned} keys scanned; {whole} of {} masters scanned to the end: the list may \
             be incomplete",
            specs.len()
        )
    };
    if locks.is_empty() {
        let none = if whole == specs.len() {
            "no locks"
        } else {
            "no locks found"
        };
        return writeln!(out, "{none} ({reach})");
    }
    let width = locks
        .iter()
        .map(|i| String::from_utf8_lossy(i.resource()).chars().count())
        .max()
        .unwrap_or(8)
        .max(8);
    writeln!(
        out,
        "{:<width$}  {:<16}  {:<7}  {:<6}  {:>7}  {:>5}  TTL",
        "RESOURCE", "HOLDER", "MASTERS", "QUORUM", "WAITERS", "FENCE"
    )?;
    for i in locks {
        let ttls: Vec<String> = i.masters().iter().map(ttl_text).collect();
        writeln!(
            out,
            "{:<width$}  {:<16}  {:<7}  {:<6}  {:>7}  {:>5}  {}",
            String::from_utf8_lossy(i.resource()),
            i.holder().unwrap_or("-"),
            format!("{}/{}", i.held_on(), i.masters().len()),
            yes_no(i.is_held()),
            i.waiters(),
            i.fencing_counter()
                .map_or_else(|| "-".to_string(), |c| c.to_string()),
            ttls.join(" "),
        )?;
    }
    writeln!(
        out,
        "{} lock{} ({reach})",
        locks.len(),
        if locks.len() == 1 { "" } else { "s" },
    )
}

fn json(
    specs: &[MasterSpec],
    scans: &[Scan],
    locks: &[Inspection],
    complete: bool,
) -> serde_json::Value {
    let masters: Vec<serde_json::Value> = specs
        .iter()
        .zip(scans)
        .map(|(spec, s)| {
            serde_json::json!({
                "master": spec.to_string(),
                "scanned": s.scanned,
                "complete": s.complete,
                "stopped": s.stopped,
            })
        })
        .collect();
    let locks: Vec<serde_json::Value> = locks
        .iter()
        .map(|i| {
            serde_json::json!({
                "resource": String::from_utf8_lossy(i.resource()),
                "holder": i.holder(),
                "held_on": i.held_on(),
                "quorum": i.quorum(),
                "locked": i.is_held(),
                "ttl_ms": i.masters().iter().map(|m| m.ttl().map(|t| t.as_millis() as u64)).collect::<Vec<_>>(),
                "waiters": i.waiters(),
                "fencing_counter": i.fencing_counter(),
                "summary": i.to_string(),
                "masters": i.masters().iter().map(master_json).collect::<Vec<_>>(),
            })
        })
        .collect();
    serde_json::json!({
        "complete": complete,
        "masters": masters,
        "locks": locks,
    })
}
