//! Helpers shared by the guest-booting integration tests.
