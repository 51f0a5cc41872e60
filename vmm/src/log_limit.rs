//! Rate limits for log lines a guest can trigger at will.
//!
//! WHY: a guest that repeats a bad request (a buffer it cannot map, a BAR
//! moved onto another, an MSI it cannot route) would otherwise write one
//! host log line per attempt, as fast as it can loop: megabytes a minute
//! of host disk and the host's logging thread spent on one guest. Each
//! call site of [`warn_limited!`] gets its own budget of [`BURST`] lines
//! per [`WINDOW_MS`]; the first line after a quiet period says how many
//! were suppressed, so nothing disappears without a trace.
//!
//! Lines that can happen only once per device reset (a queue marked
//! broken) do not need this: the reset is the limit.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

/// Lines one call site may log per window.
pub const BURST: u32 = 5;
/// The window, in milliseconds.
pub const WINDOW_MS: u64 = 10_000;

/// One call site's budget. Approximate under races (two threads may both
/// start a window), which only lets a line or two more through.
pub struct RateLimit {
    /// Start of the current window, in milliseconds since [`epoch`] (plus
    /// one, so that 0 means "no window yet").
    window_start: AtomicU64,
    used: AtomicU32,
    suppressed: AtomicU64,
}

impl Default for RateLimit {
    fn default() -> Self {
        Self::new()
    }
}

/// The process's time origin for every [`RateLimit`].
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

impl RateLimit {
    /// A fresh budget (const, for a `static` per call site).
    pub const fn new() -> Self {
        Self {
            window_start: AtomicU64::new(0),
            used: AtomicU32::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// Whether a line may be logged now: `Some(n)` with the number of
    /// lines suppressed since the last one logged, or `None` to drop it.
    pub fn allow(&self) -> Option<u64> {
        let now = u64::try_from(epoch().elapsed().as_millis()).unwrap_or(u64::MAX);
        self.allow_at(now)
    }

    /// [`allow`](Self::allow) at `now` milliseconds (tests give the time).
    pub fn allow_at(&self, now: u64) -> Option<u64> {
        let stamp = now.saturating_add(1);
        let start = self.window_start.load(Ordering::Relaxed);
        if (start == 0 || stamp.saturating_sub(start) >= WINDOW_MS)
            && self
                .window_start
                .compare_exchange(start, stamp, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.used.store(0, Ordering::Relaxed);
        }
        if self.used.fetch_add(1, Ordering::Relaxed) < BURST {
            Some(self.suppressed.swap(0, Ordering::Relaxed))
        } else {
            // Keep `used` from wrapping on a long burst.
            self.used.store(BURST, Ordering::Relaxed);
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// `log::warn!` with a budget of its own per call site (see the module
/// documentation): use it for lines a guest can trigger repeatedly.
#[macro_export]
macro_rules! warn_limited {
    ($($arg:tt)+) => {{
        static LIMIT: $crate::log_limit::RateLimit = $crate::log_limit::RateLimit::new();
        match LIMIT.allow() {
            Some(0) => log::warn!($($arg)+),
            Some(n) => log::warn!("{} ({n} similar lines suppressed)", format_args!($($arg)+)),
            None => {}
        }
    }};
}

/// A logger for tests that counts the records each thread emits, so a test
/// can bound the lines a guest action costs without seeing other tests'.
#[cfg(test)]
pub mod counting {
    use std::cell::Cell;

    struct Counter;

    thread_local! {
        static LINES: Cell<usize> = const { Cell::new(0) };
    }

    impl log::Log for Counter {
        fn enabled(&self, _: &log::Metadata<'_>) -> bool {
            true
        }
        fn log(&self, _: &log::Record<'_>) {
            LINES.with(|n| n.set(n.get() + 1));
        }
        fn flush(&self) {}
    }

    static COUNTER: Counter = Counter;

    /// Installs the counter as the test binary's logger (once; later calls
    /// do nothing) with every level enabled.
    pub fn install() {
        if log::set_logger(&COUNTER).is_ok() {
            log::set_max_level(log::LevelFilter::Trace);
        }
    }

    /// Records logged by the calling thread so far.
    pub fn lines() -> usize {
        LINES.with(Cell::get)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_passes_then_lines_are_counted_until_the_next_window() {
        let l = RateLimit::new();
        for _ in 0..BURST {
            assert_eq!(l.allow_at(100), Some(0));
        }
        for _ in 0..1000 {
            assert_eq!(l.allow_at(200), None);
        }
        assert_eq!(l.allow_at(100 + WINDOW_MS - 1), None);
        // A new window: the first line reports what was dropped.
        assert_eq!(l.allow_at(100 + WINDOW_MS), Some(1001));
        assert_eq!(l.allow_at(100 + WINDOW_MS), Some(0));
    }

    #[test]
    fn the_first_window_starts_at_time_zero_too() {
        let l = RateLimit::new();
        assert_eq!(l.allow_at(0), Some(0));
        for _ in 1..BURST {
            assert_eq!(l.allow_at(0), Some(0));
        }
        assert_eq!(l.allow_at(1), None);
    }

    #[test]
    fn each_call_site_has_its_own_budget_and_logs_at_most_a_burst() {
        counting::install();
        let before = counting::lines();
        for i in 0..100 {
            warn_limited!("test line {i}");
        }
        assert_eq!(counting::lines() - before, BURST as usize);
        // Another call site is not affected by the first one's budget.
        warn_limited!("another site");
        assert_eq!(counting::lines() - before, BURST as usize + 1);
    }
}
