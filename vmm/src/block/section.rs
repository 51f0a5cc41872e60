//! The quiescence section one virtio-blk request runs in, left and entered
//! again between chunks of its data.
//!
//! WHY chunks: a request's data moves by `preadv`/`pwritev` straight
//! between the image and guest memory, so the translation must stay valid
//! until the call returns, inside a section the guest's UNMAPs wait for.
//! One section per request made an UNMAP wait for a whole request (up to
//! a 4 GiB transfer). Translating and using the data a bounded chunk at a
//! time, each in a fresh section, makes an UNMAP wait for at most one
//! chunk; the chunk after it is translated anew and fails if its buffer
//! is gone.

use virtio_iommu::quiesce::{ReadSection, ReaderSlot};

/// A worker's section for one request: entered at creation, renewed
/// between chunks, ended when dropped. Without a slot (no quiescing
/// vIOMMU) it only counts.
pub struct Section<'a> {
    slot: Option<&'a ReaderSlot>,
    guard: Option<ReadSection<'a>>,
    renewals: u64,
    /// Run between two sections (tests: an UNMAP there must not wait).
    #[cfg(test)]
    between: Option<Box<dyn FnMut() + 'a>>,
}

impl<'a> Section<'a> {
    /// Enters a section on `slot` (none without a slot).
    pub fn enter(slot: Option<&'a ReaderSlot>) -> Self {
        Self {
            slot,
            guard: slot.map(ReaderSlot::enter),
            renewals: 0,
            #[cfg(test)]
            between: None,
        }
    }

    /// Ends the section and enters a new one. Nothing translated before
    /// may be used after: callers finish their I/O first.
    pub fn renew(&mut self) {
        self.guard = None;
        #[cfg(test)]
        if let Some(f) = self.between.as_mut() {
            f();
        }
        self.guard = self.slot.map(ReaderSlot::enter);
        self.renewals += 1;
    }

    /// How many times the section was renewed (chunks less one).
    pub fn renewals(&self) -> u64 {
        self.renewals
    }

    /// Whether a quiescence slot is behind this section.
    pub fn guarded(&self) -> bool {
        self.guard.is_some()
    }

    /// Sets what runs between two sections (tests).
    #[cfg(test)]
    pub fn set_between(&mut self, f: Box<dyn FnMut() + 'a>) {
        self.between = Some(f);
    }
}

#[cfg(test)]
#[path = "section_tests.rs"]
mod tests;
