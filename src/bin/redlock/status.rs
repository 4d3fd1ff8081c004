//! `redlock status`: per master, is it reachable, who holds the key, for how long, who
//! waits in its line, its fencing counter (the library's `Redlock::inspect`).

use std::io::{self, Write};
use std::time::Duration;

use clap::Args;
use redlock_mux::{Fault, Inspection, MasterView, Outcome, Redlock};

use crate::common::{exit, say};
use crate::{duration, MasterArgs};

pub const AFTER_HELP: &str = "\
Asks every master at once (one read-only script each: the key's value and PTTL, the
resource's line of waiters, its fencing counter), authenticating with the URL's user and
password and selecting its database, and waits for every master: at most --timeout to
connect and a second more (or --timeout, if longer) to answer.
A holder is shown by the fingerprint of its token (its first 16 hex digits, what its
release announces), never by the whole token: that is the capability to release the lock.
LINE is how many waiters stand in the resource's line on the master (the first ones are
listed below the table, by client, with whether they are still asking); FENCE the
resource's fencing counter (the last fencing token given, with --fencing).
Durations are seconds (0.5) or a number with a unit (500ms). Output to a closed pipe
(`redlock status R | head -1`) stops quietly.

Exit status:
  0    every master answered (whether or not the lock is held)
  1    some master did not answer (down, refused, timed out) or answered an error
       (wrong password, for instance)
  64   usage or configuration error
  71   the output could not be written (a full disk, say; not a closed pipe)";

#[derive(Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    masters: MasterArgs,
    /// How long each master may take to connect (then a second more, or this if longer,
    /// to answer).
    #[arg(long, value_name = "DURATION", default_value = "500ms", value_parser = duration)]
    timeout: Duration,
    /// Print one JSON object on stdout instead of the table.
    #[arg(long)]
    json: bool,
    /// The lock's name (the Redis key).
    #[arg(value_name = "RESOURCE")]
    resource: String,
}

/// A client for the operators' commands: the masters and TLS options given, connects
/// bounded by `timeout`.
pub fn client(masters: &MasterArgs, timeout: Duration) -> Result<Redlock, u8> {
    if masters.urls().is_empty() {
        say!("no masters: pass --masters URLS or set REDLOCK_MASTERS");
        return Err(exit::USAGE);
    }
    masters
        .builder()
        .connect_timeout(timeout)
        .node_timeout(timeout)
        .build()
        .map_err(|e| {
            say!("bad configuration: {e}");
            exit::USAGE
        })
}

pub fn main(args: StatusArgs) -> u8 {
    let mut client = match client(&args.masters, args.timeout) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let seen = match client.inspect(&args.resource) {
        Ok(s) => s,
        Err(e @ redlock_mux::Error::InvalidArgument(_)) => {
            say!("{e}");
            return exit::USAGE;
        }
        Err(e) => {
            say!("{e}");
            return exit::OSERR;
        }
    };
    // Written whole, then flushed; never with `println!`, which panics when stdout fails
    // (`redlock status | head -1`: EPIPE once head is gone).
    let mut out = io::BufWriter::new(io::stdout().lock());
    let written = if args.json {
        writeln!(out, "{}", json(&seen))
    } else {
        print_table(&mut out, &seen)
    }
    .and_then(|()| out.flush());
    match written {
        Ok(()) => {}
        // Whoever reads stopped reading: nothing to say, and nobody to say it to.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {}
        Err(e) => {
            say!("cannot write the status: {e}");
            return exit::OSERR;
        }
    }
    if seen
        .masters()
        .iter()
        .any(|m| crate::common::cross_slot(m.outcome()))
    {
        say!("{}", crate::common::CROSS_SLOT_HINT);
    }
    if seen.masters().iter().all(MasterView::answered) {
        exit::OK
    } else {
        exit::CONFLICT
    }
}

/// A master's state in one word, and what to say after it when it did not answer.
pub fn state(v: &MasterView) -> (&'static str, Option<String>) {
    match v.outcome() {
        Outcome::Ok if v.holder().is_some() => ("held", None),
        Outcome::Ok if v.exists() => ("other key", None),
        Outcome::Ok => ("free", None),
        o @ (Outcome::TimedOut
        | Outcome::Failed(
            Fault::Down
            | Fault::Connect(_)
            | Fault::Closed(_)
            | Fault::Resolve(_)
            | Fault::Tls(_)
            | Fault::Backlogged,
        )) => ("unreachable", Some(o.to_string())),
        o => ("error", Some(o.to_string())),
    }
}

/// A TTL the way the tables show it, one word: `850ms`, `4.5s`, `2m30s`; `-` for no key,
/// `?` for no answer.
pub fn ttl_text(v: &MasterView) -> String {
    match (v.answered(), v.ttl()) {
        (false, _) => "?".into(),
        (true, Some(t)) => compact(t),
        (true, None) if v.never_expires() => "no-expiry".into(),
        (true, None) => "-".into(),
    }
}

/// A duration in one word: `850ms`, `4.5s`, `2m30s`, `3h0m`.
pub fn compact(d: Duration) -> String {
    let ms = d.as_millis();
    match ms {
        0..=999 => format!("{ms}ms"),
        1_000..=59_999 => format!("{:.1}s", d.as_secs_f64()),
        60_000..=3_599_999 => format!("{}m{}s", ms / 60_000, ms % 60_000 / 1000),
        _ => format!("{}h{}m", ms / 3_600_000, ms % 3_600_000 / 60_000),
    }
}

fn print_table(out: &mut impl Write, seen: &Inspection) -> io::Result<()> {
    let resource = String::from_utf8_lossy(seen.resource());
    let n = seen.masters().len();
    writeln!(out, "{resource} on {n} masters (quorum {}):", seen.quorum())?;
    let width = seen
        .masters()
        .iter()
        .map(|m| m.name().len())
        .max()
        .unwrap_or(6)
        .max(6);
    writeln!(
        out,
        "  {:<width$}  {:<11}  {:<16}  {:<10}  {:>4}  FENCE",
        "MASTER", "STATE", "HOLDER", "TTL", "LINE"
    )?;
    for v in seen.masters() {
        let name = v.name();
        let (state, why) = state(v);
        if let Some(why) = why {
            writeln!(out, "  {name:<width$}  {state:<11}  {why}")?;
            continue;
        }
        let fence = match (v.fencing_counter(), v.fencing_counter_is_bad()) {
            (Some(c), _) => c.to_string(),
            (None, true) => "not a number".into(),
            (None, false) => "-".into(),
        };
        writeln!(
            out,
            "  {name:<width$}  {state:<11}  {:<16}  {:<10}  {:>4}  {fence}",
            v.holder().unwrap_or("-"),
            ttl_text(v),
            v.waiters(),
        )?;
    }
    writeln!(out, "{seen}")?;
    for v in seen
        .masters()
        .iter()
        .filter(|v| !v.first_waiters().is_empty())
    {
        let first: Vec<String> = v
            .first_waiters()
            .iter()
            .map(|w| {
                let alive = if w.is_alive() { "asking" } else { "gone" };
                format!("{} ({alive})", w.client())
            })
            .collect();
        let more = v.waiters().saturating_sub(first.len() as u64);
        writeln!(
            out,
            "  line on {}: {}{}",
            v.name(),
            first.join(", "),
            if more > 0 {
                format!(", and {more} more")
            } else {
                String::new()
            }
        )?;
    }
    Ok(())
}

/// One master's view as JSON.
pub fn master_json(v: &MasterView) -> serde_json::Value {
    let (state, why) = state(v);
    let mut j = serde_json::json!({
        "master": v.name(),
        "reachable": state != "unreachable",
        "state": state,
    });
    if let Some(why) = why {
        j["error"] = why.into();
        return j;
    }
    let first: Vec<serde_json::Value> = v
        .first_waiters()
        .iter()
        .map(|w| serde_json::json!({"client": w.client(), "alive": w.is_alive()}))
        .collect();
    let more = serde_json::json!({
        "held": v.holder().is_some(),
        "holder": v.holder(),
        "lock": v.is_lock(),
        "contended": v.is_contended(),
        "pttl_ms": v.ttl().map(|t| t.as_millis() as u64),
        "no_expiry": v.never_expires(),
        "waiters": v.waiters(),
        "first_waiters": first,
        "fencing_counter": v.fencing_counter(),
    });
    if let (Some(j), serde_json::Value::Object(more)) = (j.as_object_mut(), more) {
        j.extend(more);
    }
    j
}

fn json(seen: &Inspection) -> serde_json::Value {
    let masters: Vec<serde_json::Value> = seen.masters().iter().map(master_json).collect();
    serde_json::json!({
        "resource": String::from_utf8_lossy(seen.resource()),
        "quorum": seen.quorum(),
        "locked": seen.is_held(),
        "free": seen.is_free(),
        "holder": seen.holder(),
        "holder_masters": seen.held_on(),
        "waiters": seen.waiters(),
        "fencing_counter": seen.fencing_counter(),
        "summary": seen.to_string(),
        "masters": masters,
    })
}
