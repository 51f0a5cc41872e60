//! A small deterministic generator per thread (the test needs no crate
//! for it): each thread's choices differ, and a seed reproduces them.

/// xorshift64* state.
pub struct Rng(u64);

impl Rng {
    /// A generator for thread `n` of a run seeded with `seed`.
    pub fn new(seed: u64, n: u64) -> Self {
        Self((seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1)
    }

    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}
