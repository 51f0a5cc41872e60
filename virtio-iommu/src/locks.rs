//! The one place that decides what a poisoned lock means.
//!
//! WHY recovering the guard is sound: a lock is poisoned only when a thread
//! unwinds out of a panic while holding its guard. In the VMM that never
//! happens: `vmm/src/panic_exit.rs` installs a panic hook that exits the
//! process from inside the hook, before any unwinding drops a guard, so no
//! running thread can observe a poisoned lock and the recovery branch is
//! unreachable there. Where a panic does unwind (unit tests, fuzzing) it
//! already fails the test; taking the guard keeps the other threads of that
//! test from turning one failure into a cascade of `PoisonError` panics.
//! Every lock of this crate and of the VMM goes through [`Unpoison`], so no
//! call site carries its own `unwrap` or its own reasoning. (The test tools
//! under `tests/` are separate processes without that hook, where a test's
//! panic does unwind; they keep their own recovery.)

use std::sync::{
    LockResult, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard,
};

/// Takes the value out of any `LockResult` (`lock`, `read`, `write`,
/// `Condvar::wait`, `Mutex::into_inner`, `get_mut`), poisoned or not.
pub trait Unpoison<G> {
    /// The guard (or value), whether or not the lock was poisoned; see the
    /// module documentation for why that is sound.
    fn unpoisoned(self) -> G;
}

impl<G> Unpoison<G> for LockResult<G> {
    fn unpoisoned(self) -> G {
        self.unwrap_or_else(PoisonError::into_inner)
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unpoisoned()
}

pub(crate) fn read<T>(m: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    m.read().unpoisoned()
}

pub(crate) fn write<T>(m: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    m.write().unpoisoned()
}
