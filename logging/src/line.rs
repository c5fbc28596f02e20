//! The layer that turns an event and its spans into one line of text.
//!
//! tracing-subscriber's `fmt` layer puts span fields in front of the
//! message; gradwire's lines have always started with the rank
//! (`gradwire INFO rank 3: ...`), which people and tests grep for, so this
//! small layer prints the rank first, the message, the event's own fields,
//! and then, on every line but INFO ones, the remaining span fields
//! (communicator id, operation sequence). A whole line is written with one call, so
//! lines from several threads never interleave.

use std::fmt::{self, Write as _};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::{LookupSpan, SpanRef};

/// What goes in front of the level.
#[derive(Clone, Copy, Debug)]
pub struct Style {
    name: &'static str,
    timestamp: bool,
}

impl Style {
    /// `NAME LEVEL ...`, as the library has always printed.
    pub fn plain(name: &'static str) -> Style {
        Style {
            name,
            timestamp: false,
        }
    }

    /// `2026-12-01T19:02:03.123Z NAME LEVEL ...`, for services whose logs
    /// are read after the fact.
    pub fn timestamped(name: &'static str) -> Style {
        Style {
            name,
            timestamp: true,
        }
    }
}

/// Where finished lines go.
type Sink = Arc<dyn Fn(&[u8]) + Send + Sync>;

/// Prints events as lines (see the module comment).
pub struct LineLayer {
    style: Style,
    sink: Sink,
}

impl LineLayer {
    /// Lines to `make()`'s writer (stderr for the binaries).
    pub fn new<W: std::io::Write + 'static>(style: Style, make: fn() -> W) -> LineLayer {
        LineLayer {
            style,
            sink: Arc::new(move |b: &[u8]| {
                let _ = make().write_all(b);
            }),
        }
    }

    /// Lines to any sink (tests collect them).
    pub fn to_sink(style: Style, sink: impl Fn(&[u8]) + Send + Sync + 'static) -> LineLayer {
        LineLayer {
            style,
            sink: Arc::new(sink),
        }
    }

    /// This layer, printing only what `filter` enables.
    pub fn with_filter_targets<S>(
        self,
        filter: tracing_subscriber::filter::Targets,
    ) -> tracing_subscriber::filter::Filtered<Self, tracing_subscriber::filter::Targets, S>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        Layer::with_filter(self, filter)
    }
}

/// The fields of a span, as text, kept in the span's extensions.
#[derive(Default)]
struct Fields(Vec<(&'static str, String)>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let v = format!("{value:?}");
        self.set(field.name(), v);
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.set(field.name(), value.to_owned());
    }
}

impl Fields {
    fn set(&mut self, name: &'static str, v: String) {
        match self.0.iter_mut().find(|(k, _)| *k == name) {
            Some(slot) => slot.1 = v,
            None => self.0.push((name, v)),
        }
    }
}

/// An event's message and other fields.
#[derive(Default)]
struct EventText {
    message: String,
    rest: Vec<(&'static str, String)>,
}

impl Visit for EventText {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            self.rest.push((field.name(), format!("{value:?}")));
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            self.rest.push((field.name(), value.to_owned()));
        }
    }
}

impl<S> Layer<S> for LineLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut f = Fields::default();
        attrs.record(&mut f);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(f);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            let mut ext = span.extensions_mut();
            if let Some(f) = ext.get_mut::<Fields>() {
                values.record(f);
            }
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut text = EventText::default();
        event.record(&mut text);
        // Innermost span first: its rank wins, and its fields are the most
        // specific context.
        let mut rank: Option<String> = None;
        let mut context: Vec<(&'static str, String)> = Vec::new();
        let mut take = |span: SpanRef<'_, S>| {
            let ext = span.extensions();
            let Some(f) = ext.get::<Fields>() else {
                return;
            };
            for (k, v) in &f.0 {
                if *k == "rank" {
                    rank.get_or_insert_with(|| v.clone());
                } else if !context.iter().any(|(c, _)| c == k) {
                    context.push((k, v.clone()));
                }
            }
        };
        if let Some(scope) = ctx.event_scope(event) {
            scope.for_each(&mut take);
        }
        // The communicator `context::enter` stands in for, outermost.
        if let Some(scope) = crate::context::stand_in().and_then(|id| ctx.span_scope(&id)) {
            scope.for_each(&mut take);
        }
        let line = render(
            self.style,
            *event.metadata().level(),
            rank.as_deref(),
            &text,
            &context,
            SystemTime::now(),
        );
        (self.sink)(line.as_bytes());
    }
}

fn level_name(l: Level) -> &'static str {
    match l {
        Level::ERROR => "ERROR",
        Level::WARN => "WARN",
        Level::INFO => "INFO",
        Level::DEBUG => "DEBUG",
        Level::TRACE => "TRACE",
    }
}

fn render(
    style: Style,
    level: Level,
    rank: Option<&str>,
    text: &EventText,
    context: &[(&'static str, String)],
    now: SystemTime,
) -> String {
    let mut s = String::with_capacity(64 + text.message.len());
    if style.timestamp {
        write_utc(&mut s, now);
        s.push(' ');
    }
    let _ = write!(s, "{} {}", style.name, level_name(level));
    if let Some(r) = rank {
        let _ = write!(s, " rank {r}");
    }
    s.push_str(": ");
    s.push_str(&text.message);
    for (k, v) in &text.rest {
        let _ = write!(s, " {k}={v}");
    }
    // INFO lines are read as a description of the set-up ("rank 1 (host):
    // shm"), one communicator at a time, and have always ended with their
    // message; failures and detail carry the full context.
    if !context.is_empty() && level != Level::INFO {
        s.push_str(" {");
        for (i, (k, v)) in context.iter().enumerate() {
            if i > 0 {
                s.push_str(", ");
            }
            let _ = write!(s, "{k}={v}");
        }
        s.push('}');
    }
    s.push('\n');
    s
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` without a date library: days since the epoch
/// to a civil date (Howard Hinnant's algorithm).
fn write_utc(s: &mut String, now: SystemTime) {
    let d = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let _ = write!(
        s,
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        d.subsec_millis()
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::time::Duration;
    use tracing_subscriber::layer::SubscriberExt;

    fn capture(style: Style, body: impl FnOnce()) -> String {
        let out = Arc::new(Mutex::new(Vec::<u8>::new()));
        let sink = out.clone();
        let sub = tracing_subscriber::registry().with(LineLayer::to_sink(style, move |b| {
            sink.lock().unwrap().extend_from_slice(b)
        }));
        tracing::subscriber::with_default(sub, body);
        let v = out.lock().unwrap().clone();
        String::from_utf8(v).unwrap()
    }

    #[test]
    fn the_rank_comes_first_and_the_rest_of_the_context_after() {
        let got = capture(Style::plain("gradwire"), || {
            let comm = tracing::error_span!("comm", rank = 3, comm = "00ff");
            let _c = comm.enter();
            tracing::info!("pipeline depth 1");
            let op = tracing::error_span!("op", seq = 12);
            let _o = op.enter();
            tracing::warn!(peer = 2, "stalled");
        });
        assert_eq!(
            got,
            "gradwire INFO rank 3: pipeline depth 1\n\
             gradwire WARN rank 3: stalled peer=2 {seq=12, comm=00ff}\n"
        );
    }

    #[test]
    fn lines_outside_any_communicator_have_no_rank() {
        let got = capture(Style::plain("gradwire"), || {
            tracing::warn!("store: refused")
        });
        assert_eq!(got, "gradwire WARN: store: refused\n");
    }

    #[test]
    fn utc_timestamps_are_civil_dates() {
        let mut s = String::new();
        write_utc(
            &mut s,
            UNIX_EPOCH + Duration::from_millis(1_764_615_723_045),
        );
        assert_eq!(s, "2025-12-01T19:02:03.045Z");
        s.clear();
        write_utc(&mut s, UNIX_EPOCH + Duration::from_secs(951_782_400));
        assert_eq!(s, "2000-02-29T00:00:00.000Z");
        let line = render(
            Style::timestamped("gwjob"),
            Level::INFO,
            None,
            &EventText {
                message: "serving".into(),
                rest: vec![],
            },
            &[],
            UNIX_EPOCH,
        );
        assert_eq!(line, "1970-01-01T00:00:00.000Z gwjob INFO: serving\n");
    }
}
