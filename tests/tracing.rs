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
    fn record(&self, _: &Id, _: &Record<'_>) {}
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
