//! Fault events for the event virtqueue, and rate-limited fault logging.
//!
//! WHY bounded and rate-limited: faults are triggered by guest-controlled DMA.
//! A hostile or buggy guest can fault millions of times per second, so the
//! pending-event queue has a fixed capacity (excess events are dropped and
//! counted, which the spec allows: "If no buffer is available, the device can
//! either wait for one to be consumed, or drop the event"), and the host log
//! gets at most a fixed number of lines per second plus a summary of how many
//! were suppressed.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::locks::Unpoison;
use crate::wire::{FaultEvent, FAULT_SIZE};

/// Default number of pending fault events kept for the event queue.
pub const DEFAULT_FAULT_QUEUE_CAPACITY: usize = 256;
/// Default number of fault log lines per second.
pub const DEFAULT_FAULT_LOGS_PER_SEC: u32 = 10;

/// Allows at most `per_window` events per `window`; counts the rest.
#[derive(Debug)]
pub struct RateLimiter {
    per_window: u32,
    window: Duration,
    state: Mutex<RateState>,
}

#[derive(Debug)]
struct RateState {
    start: Instant,
    used: u32,
    suppressed: u64,
}

/// Outcome of asking a [`RateLimiter`] for permission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateDecision {
    /// Go ahead; `suppressed_before` events were swallowed since the last
    /// permitted one in a previous window (report it once).
    Allow {
        /// Events swallowed before this one.
        suppressed_before: u64,
    },
    /// Over budget for this window.
    Suppress,
}

impl RateLimiter {
    /// A limiter allowing `per_window` events per `window`.
    pub fn new(per_window: u32, window: Duration) -> Self {
        Self {
            per_window,
            window,
            state: Mutex::new(RateState {
                start: Instant::now(),
                used: 0,
                suppressed: 0,
            }),
        }
    }

    /// Asks for permission to log one event now.
    pub fn check(&self) -> RateDecision {
        self.check_at(Instant::now())
    }

    /// Same as [`check`](Self::check) at an explicit time (for tests).
    pub fn check_at(&self, now: Instant) -> RateDecision {
        let mut s = self.state.lock().unpoisoned();
        let mut suppressed_before = 0;
        if now.saturating_duration_since(s.start) >= self.window {
            s.start = now;
            s.used = 0;
            suppressed_before = std::mem::take(&mut s.suppressed);
        }
        if s.used < self.per_window {
            s.used = s.used.saturating_add(1);
            RateDecision::Allow { suppressed_before }
        } else {
            s.suppressed = s.suppressed.saturating_add(1);
            // Keep a count carried from a previous window for the next report.
            s.suppressed = s.suppressed.saturating_add(suppressed_before);
            RateDecision::Suppress
        }
    }
}

/// Bounded FIFO of fault events waiting for event-queue buffers.
#[derive(Debug)]
pub struct FaultQueue {
    capacity: usize,
    queue: Mutex<VecDeque<FaultEvent>>,
    dropped: AtomicU64,
    reported: AtomicU64,
    log_limiter: RateLimiter,
}

impl FaultQueue {
    /// A queue keeping at most `capacity` pending events, logging at most `logs_per_sec` faults per second.
    pub fn new(capacity: usize, logs_per_sec: u32) -> Self {
        Self {
            capacity,
            queue: Mutex::new(VecDeque::with_capacity(capacity.min(1024))),
            dropped: AtomicU64::new(0),
            reported: AtomicU64::new(0),
            log_limiter: RateLimiter::new(logs_per_sec, Duration::from_secs(1)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<FaultEvent>> {
        self.queue.lock().unpoisoned()
    }

    /// Records a fault: logs it (rate-limited) and queues it for the event
    /// queue, or drops and counts it if the queue is full.
    pub fn report(&self, ev: FaultEvent) {
        self.reported.fetch_add(1, Ordering::Relaxed);
        if let RateDecision::Allow { suppressed_before } = self.log_limiter.check() {
            if suppressed_before > 0 {
                log::warn!("virtio-iommu: {suppressed_before} fault log lines suppressed");
            }
            log::warn!(
                "virtio-iommu: DMA fault endpoint {:#x} reason {} flags {:#x} address {:#x}",
                ev.endpoint,
                ev.reason,
                ev.flags,
                ev.address
            );
        }
        let mut q = self.lock();
        if q.len() >= self.capacity {
            drop(q);
            self.dropped.fetch_add(1, Ordering::Relaxed);
        } else {
            q.push_back(ev);
        }
    }

    /// Next pending event, encoded for an event-queue buffer.
    pub fn pop(&self) -> Option<[u8; FAULT_SIZE]> {
        self.lock().pop_front().map(|e| e.encode())
    }

    /// Next pending event, decoded (for consumers that want the fields).
    pub fn pop_event(&self) -> Option<FaultEvent> {
        self.lock().pop_front()
    }

    /// Pending events.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no event is pending.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Events dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// All faults ever reported (queued or dropped).
    pub fn reported(&self) -> u64 {
        self.reported.load(Ordering::Relaxed)
    }

    /// Device reset: pending events belong to the old driver instance.
    pub fn clear(&self) {
        self.lock().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::FAULT_R_DOMAIN;

    fn ev(a: u64) -> FaultEvent {
        FaultEvent {
            reason: FAULT_R_DOMAIN,
            flags: 0,
            endpoint: 1,
            address: a,
        }
    }

    #[test]
    fn queue_is_bounded_and_counts_drops() {
        let q = FaultQueue::new(3, 1);
        for a in 0..10 {
            q.report(ev(a));
        }
        assert_eq!(q.len(), 3);
        assert_eq!(q.dropped(), 7);
        assert_eq!(q.reported(), 10);
        // FIFO: the first three survive.
        for a in 0..3 {
            assert_eq!(q.pop_event().unwrap().address, a);
        }
        assert!(q.pop().is_none());
    }

    #[test]
    fn rate_limiter_allows_budget_then_reports_suppressed() {
        let r = RateLimiter::new(2, Duration::from_secs(1));
        let t0 = Instant::now();
        assert_eq!(
            r.check_at(t0),
            RateDecision::Allow {
                suppressed_before: 0
            }
        );
        assert!(matches!(r.check_at(t0), RateDecision::Allow { .. }));
        assert_eq!(r.check_at(t0), RateDecision::Suppress);
        assert_eq!(r.check_at(t0), RateDecision::Suppress);
        let t1 = t0 + Duration::from_millis(1500);
        assert_eq!(
            r.check_at(t1),
            RateDecision::Allow {
                suppressed_before: 2
            }
        );
    }
}
