//! The store's log of refused connections must not grow with the number of
//! strangers: anyone who can reach the port can be refused as often as they
//! like. A process-wide tracing subscriber (the store logs from its own
//! threads) collects the warnings while real clients with the wrong token
//! are refused over loopback.

use gw_rendezvous::{StoreClient, StoreConfig, StoreServer};
use std::fmt::Debug;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// Every warning's message, in order.
static WARNINGS: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Collect;

struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl Subscriber for Collect {
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        *m.level() <= Level::WARN
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, e: &Event<'_>) {
        let mut m = Message(String::new());
        e.record(&mut m);
        WARNINGS.lock().unwrap_or_else(|p| p.into_inner()).push(m.0);
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

fn refusals() -> Vec<String> {
    WARNINGS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter(|m| m.contains("refused connection"))
        .cloned()
        .collect()
}

#[test]
fn refusals_are_logged_at_most_once_a_second_and_the_next_line_counts_the_rest() {
    tracing::subscriber::set_global_default(Collect).expect("the only subscriber");
    let s = StoreServer::start(
        "127.0.0.1:0".parse().expect("addr"),
        "the-real-token",
        StoreConfig::default(),
    )
    .expect("start store");
    let addr = s.local_addr().to_string();
    let t0 = Instant::now();
    let strangers = 40;
    for i in 0..strangers {
        let r = StoreClient::connect(&addr, "a-guess", Instant::now() + Duration::from_secs(30));
        match r {
            Err(e) => assert!(
                e.to_string().contains("wrong job token"),
                "stranger {i}: {e}"
            ),
            Ok(_) => panic!("stranger {i} was let in"),
        }
    }
    let burst = t0.elapsed();
    // Let the last refusal's thread log (or not), then pass the period so
    // that one more refusal is let through and reports the ones left out.
    std::thread::sleep(Duration::from_millis(1100));
    let late = StoreClient::connect(&addr, "a-guess", Instant::now() + Duration::from_secs(30));
    assert!(late.is_err(), "the late stranger was let in");
    // Its thread logs after answering; give it a bounded while.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !refusals().iter().any(|m| m.contains("more like it")) {
        assert!(
            Instant::now() < deadline,
            "no line counted the refusals left out: {:?}",
            refusals()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let lines = refusals();
    // One line per started second of the burst, plus the late one.
    let allowed = burst.as_secs() as usize + 2;
    assert!(
        lines.len() <= allowed,
        "{} refusal lines for {} strangers in {burst:?}: {lines:?}",
        lines.len(),
        strangers + 1
    );
    assert!(lines[0].contains("wrong job token"), "{lines:?}");
    drop(s);
}
