//! A rate limit for log lines that a stranger can cause.
//!
//! A server that logs every refused client lets any process that can reach
//! its port fill the job's output (and its disk) one connection at a time.
//! Refusals still matter (a refused rank is usually a misconfigured launch),
//! so the first one is always logged and the next permitted line says how
//! many were left out in between. Public so that every server of the project
//! (the store, the job server's front door) limits its log the same way.

use std::time::{Duration, Instant};

/// Lets one event through per `period` and counts the rest.
#[derive(Debug)]
pub struct RateLimited {
    period: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl RateLimited {
    pub const fn new(period: Duration) -> Self {
        RateLimited {
            period,
            last: None,
            suppressed: 0,
        }
    }

    /// `Some(events left out since the last one let through)` when this one
    /// may be logged, else `None` (and it is counted).
    pub fn admit(&mut self) -> Option<u64> {
        self.admit_at(Instant::now())
    }

    /// [`RateLimited::admit`] at a given time, so tests need no sleeping.
    pub fn admit_at(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(t) if now.saturating_duration_since(t) < self.period => {
                self.suppressed = self.suppressed.saturating_add(1);
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

/// The tail of a log line let through after `n` were left out: empty for 0.
pub fn suppressed(n: u64) -> String {
    if n == 0 {
        String::new()
    } else {
        format!(" ({n} more like it since the last report)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_event_per_period_and_the_next_counts_what_was_left_out() {
        let mut r = RateLimited::new(Duration::from_secs(1));
        let t0 = Instant::now();
        assert_eq!(r.admit_at(t0), Some(0));
        for ms in [1, 500, 999] {
            assert_eq!(r.admit_at(t0 + Duration::from_millis(ms)), None);
        }
        assert_eq!(r.admit_at(t0 + Duration::from_secs(1)), Some(3));
        assert_eq!(r.admit_at(t0 + Duration::from_millis(1500)), None);
        assert_eq!(r.admit_at(t0 + Duration::from_secs(5)), Some(1));
        // Nothing was left out since: the next line says nothing extra.
        assert_eq!(r.admit_at(t0 + Duration::from_secs(7)), Some(0));
    }

    #[test]
    fn a_clock_reading_earlier_than_the_last_is_within_the_period() {
        let mut r = RateLimited::new(Duration::from_secs(1));
        let t0 = Instant::now() + Duration::from_secs(10);
        assert_eq!(r.admit_at(t0), Some(0));
        assert_eq!(r.admit_at(t0 - Duration::from_secs(3)), None);
    }

    #[test]
    fn suppressed_tail_names_the_count() {
        assert_eq!(suppressed(0), "");
        assert_eq!(suppressed(7), " (7 more like it since the last report)");
    }
}
