//! `redlock release --force RESOURCE`: an operator's release of a lock whoever holds it
//! (the library's `inspect`, then `force_release`).

use std::time::Duration;

use clap::Args;
use redlock_mux::{ForcedRelease, Inspection, Outcome};

use crate::common::{exit, out, say};
use crate::run;
use crate::status::{client, master_json, ttl_text};
use crate::{duration, MasterArgs};

pub const AFTER_HELP: &str = "\
A lock is released by its holder (`redlock run` releases when COMMAND's processes are
gone). --force is for a holder that is gone or stuck: the lock's key is deleted on every
master whatever its token, and its waiters are told at once (the first live waiter in
its line, or every waiter), as by the holder's own release.
First the lock is looked at (as `redlock status`). While a quorum of masters holds it for
one holder (a live holder: its keys have not expired), or too few masters answered to
tell, nothing is deleted without --yes. The holder is not told: it finds out at its next
extension (a `redlock run` then stops COMMAND with its --lost-exit-code), and until then
it may still act under the lock.
Holders are shown by the fingerprint of their token (its first 16 hex digits).

Exit status:
  0    the lock is free: a quorum of masters has no key now (or none had one)
  1    not released: a live holder holds it (or too few masters answered to tell), and
       --yes was not given
  64   usage or configuration error, or so many masters refuse this client (a wrong
       password, an ACL without the lock's keys, an untrusted certificate) that no
       quorum can answer, with or without --yes
  69   too few masters answered the forced release: the masters that did not keep their
       key until it expires";

#[derive(Args, Debug)]
pub struct ReleaseArgs {
    #[command(flatten)]
    masters: MasterArgs,
    /// Delete the lock whatever its token (required: a lock is otherwise released by its
    /// holder).
    #[arg(long, required = true)]
    force: bool,
    /// Delete it even while a quorum holds it for a live holder.
    #[arg(short = 'y', long)]
    yes: bool,
    /// How long each master may take to connect (then a second more, or this if longer,
    /// to answer).
    #[arg(long, value_name = "DURATION", default_value = "500ms", value_parser = duration)]
    timeout: Duration,
    /// Print one JSON object on stdout (what was seen, what was deleted) instead of text.
    #[arg(long)]
    json: bool,
    /// The lock's name (the Redis key).
    #[arg(value_name = "RESOURCE")]
    resource: String,
}

pub fn main(args: ReleaseArgs) -> u8 {
    debug_assert!(args.force);
    let mut client = match client(&args.masters, args.timeout) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let r = &args.resource;
    let seen = match client.inspect(r) {
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
    // Masters that refuse this client whatever it does (a wrong password, an ACL without
    // the key, an untrusted certificate), so many that no quorum is left: a configuration
    // error, which --yes cannot cure. (It said "cannot tell who holds it ... pass --yes",
    // then with --yes exited 69.)
    let refusing: Vec<(&str, Outcome)> = seen
        .masters()
        .iter()
        .map(|m| (m.name(), m.outcome()))
        .filter(|(_, o)| run::refuses(*o))
        .collect();
    let (n, k) = (seen.masters().len(), refusing.len());
    if k > 0 && n - k < seen.quorum() {
        let each: Vec<String> = refusing.iter().map(|(m, o)| format!("{m}: {o}")).collect();
        say!(
            "cannot release {r}: {k} of {n} master{} refuse{} this client ({}), so no quorum \
             of {} can be looked at or released, with or without --yes: {}",
            if n == 1 { "" } else { "s" },
            if k == 1 { "s" } else { "" },
            each.join("; "),
            seen.quorum(),
            run::hints(&refusing, r).join("; "),
        );
        return exit::USAGE;
    }
    let unknown = !seen.is_held() && !seen.is_free() && seen.answered() < seen.quorum();
    if (seen.is_held() || unknown) && !args.yes {
        if args.json {
            out!("{}", json(&seen, None));
        }
        if seen.is_held() {
            let longest = seen.masters().iter().filter_map(|m| m.ttl()).max();
            say!(
                "{r} is held: {seen}{}. Not released: pass --yes to delete it anyway (its \
                 holder finds out at its next extension; a `redlock run` holding it stops \
                 its command)",
                longest.map_or_else(String::new, |t| format!(
                    "; its keys live up to {} more",
                    humantime::format_duration(Duration::from_millis(t.as_millis() as u64))
                ))
            );
        } else {
            say!(
                "{r}: cannot tell who holds it: {seen}. Not released: pass --yes to delete it \
                 on the masters that answer"
            );
        }
        return exit::CONFLICT;
    }
    if seen.answered() > 0 && seen.masters().iter().all(|m| !m.answered() || !m.exists()) {
        if args.json {
            out!("{}", json(&seen, None));
        } else {
            say!("{r}: no master that answered has the key: nothing to release ({seen})");
        }
        return if seen.is_free() {
            exit::OK
        } else {
            exit::UNAVAILABLE
        };
    }
    let forced = match client.force_release(r) {
        Ok(f) => f,
        Err(e) => {
            say!("{e}");
            return exit::OSERR;
        }
    };
    if args.json {
        out!("{}", json(&seen, Some(&forced)));
    } else {
        print(&seen, &forced);
    }
    if forced.is_free() {
        exit::OK
    } else {
        exit::UNAVAILABLE
    }
}

fn print(seen: &Inspection, forced: &ForcedRelease) {
    let r = String::from_utf8_lossy(forced.resource());
    out!("{r} was: {seen}");
    for (m, v) in forced.masters().iter().zip(seen.masters()) {
        let what = match (m.removed(), m.is_free()) {
            (Some(h), _) => {
                let woke = match m.woke() {
                    Some(c) => format!("; told waiter {c} it is its turn"),
                    None => "; announced on the resource's channel".into(),
                };
                format!("deleted {h}'s key (TTL was {}){woke}", ttl_text(v))
            }
            (None, true) => "no key".into(),
            (None, false) => format!("not deleted: {}", m.outcome()),
        };
        out!("  {}: {what}", m.name());
    }
    out!("{r}: {forced}");
}

fn json(seen: &Inspection, forced: Option<&ForcedRelease>) -> serde_json::Value {
    let before: Vec<serde_json::Value> = seen.masters().iter().map(master_json).collect();
    let mut j = serde_json::json!({
        "resource": String::from_utf8_lossy(seen.resource()),
        "quorum": seen.quorum(),
        "holder": seen.holder(),
        "locked": seen.is_held(),
        "seen": seen.to_string(),
        "before": before,
        "released": forced.is_some_and(ForcedRelease::is_free),
    });
    if let Some(f) = forced {
        let masters: Vec<serde_json::Value> = f
            .masters()
            .iter()
            .map(|m| {
                serde_json::json!({
                    "master": m.name(),
                    "outcome": m.outcome().to_string(),
                    "free": m.is_free(),
                    "removed": m.removed(),
                    "woke": m.woke(),
                })
            })
            .collect();
        j["forced"] = serde_json::json!({
            "holder": f.holder(),
            "removed_on": f.removed_on(),
            "summary": f.to_string(),
            "masters": masters,
        });
    }
    j
}
