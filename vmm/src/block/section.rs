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

use std::ops::Deref;

use crate::dma::{DmaGuard, DmaSpace, ThreadDma};

/// A worker's section for one request: entered at creation, renewed
/// between chunks, ended when dropped; the request's guest memory is
/// reachable only through it (it dereferences to the worker's
/// [`DmaSpace`]). Without a quiescing vIOMMU it only counts.
pub struct Section<'a> {
    guard: DmaGuard<'a>,
    renewals: u64,
    /// Run between two sections (tests: an UNMAP there must not wait).
    #[cfg(test)]
    between: Option<Box<dyn FnMut() + 'a>>,
}

impl<'a> Section<'a> {
    /// Enters a section of the worker's `dma` handle.
    pub fn enter(dma: &'a mut ThreadDma) -> Self {
        Self {
            guard: dma.access(),
            renewals: 0,
            #[cfg(test)]
            between: None,
        }
    }

    /// Ends the section and enters a new one. Nothing translated before
    /// may be used after: callers finish their I/O first.
    pub fn renew(&mut self) {
        #[cfg(test)]
        let between = self.between.as_mut();
        self.guard.renew_with(|| {
            #[cfg(test)]
            if let Some(f) = between {
                f();
            }
        });
        self.renewals += 1;
    }

    /// How many times the section was renewed (chunks less one).
    pub fn renewals(&self) -> u64 {
        self.renewals
    }

    /// Whether a quiescence slot is behind this section.
    pub fn guarded(&self) -> bool {
        self.guard.guarded()
    }

    /// Sets what runs between two sections (tests).
    #[cfg(test)]
    pub fn set_between(&mut self, f: Box<dyn FnMut() + 'a>) {
        self.between = Some(f);
    }
}

impl Deref for Section<'_> {
    type Target = DmaSpace;

    fn deref(&self) -> &DmaSpace {
        &self.guard
    }
}

#[cfg(test)]
#[path = "section_tests.rs"]
mod tests;
