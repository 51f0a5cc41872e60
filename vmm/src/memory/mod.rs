//! Guest physical memory: where everything lives and how RAM is created.

pub mod guest;
pub mod layout;
pub mod slots;

pub use guest::{create_guest_memory, GuestMemoryMmap};
