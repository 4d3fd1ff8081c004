//! The `tracing` feature: a span per lock operation, an event per master's answer, one per
//! result; observed with a minimal subscriber of the test's own (no extra crates).

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

use redlock_mux::Redlock;
use support::masters;

#[derive(Default)]
struct Seen {
    spans: Mutex<Vec<String>>,
    /// Fields recorded on a span after it was made: (span id, `name=value `).
    records: Mutex<Vec<(u64, String)>>,
    events: Mutex<Vec<String>>,
    next: AtomicU64,
}

struct Collect(Arc<Seen>);

struct Text<'a>(&'a mut String);
impl Visit for Text<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!("{}={:?} ", field.name(), value));
    }
}

impl Subscriber for Collect {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let mut s = format!("{} ", span.metadata().name());
        span.record(&mut Text(&mut s));
        self.0.spans.lock().unwrap().push(s);
        Id::from_u64(self.0.next.fetch_add(1, Ordering::Relaxed) + 1)
    }
    fn record(&self, id: &Id, values: &Record<'_>) {
        let mut s = String::new();
        values.record(&mut Text(&mut s));
        self.0.records.lock().unwrap().push((id.into_u64(), s));
    }
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut s = String::new();
        event.record(&mut Text(&mut s));
        self.0.events.lock().unwrap().push(s);
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

#[test]
fn spans_per_operation_and_events_per_answer() {
    let m = masters(3);
    let seen = Arc::new(Seen::default());
    tracing::subscriber::with_default(Collect(seen.clone()), || {
        let mut c = Redlock::builder().masters(m.urls()).build().unwrap();
        let lock = c.try_lock("traced", Duration::from_secs(5)).unwrap();
        c.release(lock).unwrap();
    });
    let spans = seen.spans.lock().unwrap();
    let events = seen.events.lock().unwrap();
    assert_eq!(spans.len(), 2, "{spans:?}");
    assert!(
        spans[0].contains("redlock_mux::lock") && spans[0].contains("traced"),
        "{spans:?}"
    );
    assert!(spans[1].contains("Release"), "{spans:?}");
    let answers = events.iter().filter(|e| e.contains("answer")).count();
    assert_eq!(answers, 6, "one per master per round: {events:?}");
    assert!(events
        .iter()
        .any(|e| e.contains("master=") && e.contains("outcome=ok")));
    let results = events.iter().filter(|e| e.contains("message=done")).count();
    assert_eq!(results, 2, "{events:?}");
}

/// The lock span carries how long the call waited for the lock and how long it was held:
/// `waited_us` at the grant, `held_us` at the release (dropped guards too).
#[test]
fn the_lock_span_records_the_wait_and_the_hold() {
    let m = masters(3);
    let seen = Arc::new(Seen::default());
    tracing::subscriber::with_default(Collect(seen.clone()), || {
        let mut c = Redlock::builder().masters(m.urls()).build().unwrap();
        let lock = c.try_lock("traced", Duration::from_secs(5)).unwrap();
        let held = std::time::Instant::now();
        while held.elapsed() < Duration::from_millis(20) {
            std::thread::sleep(Duration::from_millis(5));
        }
        c.release(lock).unwrap();
        let shared = Redlock::builder().masters(m.urls()).build_shared().unwrap();
        let guard = shared
            .lock("traced2", Duration::from_secs(5))
            .wait()
            .unwrap();
        guard.release().wait().unwrap();
        let guard = shared
            .lock("traced3", Duration::from_secs(5))
            .wait()
            .unwrap();
        // Released by the loop thread, after the drop: recorded a little later.
        drop(guard);
    });
    let recorded = |span_name: &str| {
        let spans = seen.spans.lock().unwrap();
        let Some(k) = spans.iter().position(|s| s.contains(span_name)) else {
            return false;
        };
        let id = k as u64 + 1;
        seen.records
            .lock()
            .unwrap()
            .iter()
            .any(|(s, r)| *s == id && r.starts_with("held_us="))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !recorded("traced3") && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let spans = seen.spans.lock().unwrap();
    let records = seen.records.lock().unwrap();
    let value = |span: u64, field: &str| -> Option<u64> {
        records.iter().find_map(|(id, r)| {
            let rest = r.strip_prefix(&format!("{field}="))?;
            (*id == span).then(|| rest.trim().parse().ok())?
        })
    };
    // Span 1: the single owner's lock call; held at least the 20 ms it waited above.
    let waited = value(1, "waited_us").expect("waited_us recorded");
    let held = value(1, "held_us").expect("held_us recorded");
    assert!(waited < 5_000_000, "{records:?}");
    assert!(held >= 20_000, "held {held} us: {records:?}");
    // The shared client's lock spans get both too: the hold at the guard's release, and
    // at a dropped guard's release by the loop.
    for name in ["traced2", "traced3"] {
        let span = spans
            .iter()
            .position(|s| s.contains(name))
            .expect("the shared lock's span") as u64
            + 1;
        assert!(value(span, "waited_us").is_some(), "{name}: {records:?}");
        assert!(value(span, "held_us").is_some(), "{name}: {records:?}");
    }
}
