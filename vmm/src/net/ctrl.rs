//! virtio-net's control queue (VIRTIO_NET_F_CTRL_VQ), served by the VMM for
//! both kinds of device: the TAP device's first worker, and a thread of the
//! vhost-user front-end (the back-end never sees the control queue; it only
//! learns which rings to use through SET_VRING_ENABLE).
//!
//! Commands are decoded here and carried out by the caller; the only one
//! implemented is MQ / VQ_PAIRS_SET (virtio 1.2, 5.1.6.5.5). Anything else,
//! or a command that is malformed or unreadable, is answered
//! VIRTIO_NET_ERR. A malformed ring or chain stops the queue.

use vm_memory::{Bytes, GuestAddress};

use super::queue::{break_queue, pop_head, signal_used, WorkerQueue};
use crate::dma::{DmaSpace, ThreadDma};
use crate::virtio::chain::{walk_into, Chain};
use crate::virtio::VirtioInterrupt;
use crate::width::usize_from_u64;
use virtio_queue::QueueT;

/// Class MQ, command VQ_PAIRS_SET.
const CLASS_MQ: u8 = 4;
const MQ_VQ_PAIRS_SET: u8 = 0;
/// The acknowledgement byte.
const ACK_OK: u8 = 0;
const ACK_ERR: u8 = 1;
/// Control commands are tiny; anything longer is refused.
const MAX_COMMAND_LEN: u64 = 4096;

/// A command this device implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtrlCommand {
    /// Use the first N queue pairs.
    SetQueuePairs(u16),
}

/// Decodes a command's bytes (class, command, data).
pub fn decode(cmd: &[u8]) -> Option<CtrlCommand> {
    match (cmd.first(), cmd.get(1), cmd.get(2..4)) {
        (Some(&CLASS_MQ), Some(&MQ_VQ_PAIRS_SET), Some(&[lo, hi])) => {
            Some(CtrlCommand::SetQueuePairs(u16::from_le_bytes([lo, hi])))
        }
        _ => None,
    }
}

/// Reads the readable part of `chain` through `mem` and decodes it.
fn read_command(mem: &DmaSpace, chain: &Chain) -> Option<CtrlCommand> {
    let len = chain.readable_len();
    if !(2..=MAX_COMMAND_LEN).contains(&len) {
        return None;
    }
    let mut cmd = Vec::with_capacity(usize_from_u64(len));
    for b in &chain.readable {
        let start = cmd.len();
        cmd.resize(start + b.len as usize, 0);
        mem.read_slice(cmd.get_mut(start..)?, GuestAddress(b.addr))
            .ok()?;
    }
    decode(&cmd)
}

/// Serves every command waiting on `c`: each goes to `exec`, which carries
/// it out and says whether it succeeded; the acknowledgement is written
/// into the chain's first writable byte and the chain returned used.
/// Each chain is translated and completed inside one section of the
/// thread's `dma` handle; ring-index accesses between chains in sections
/// of their own.
pub fn serve_ctrl_queue(
    c: &mut WorkerQueue,
    dma: &mut ThreadDma,
    interrupt: &dyn VirtioInterrupt,
    chain: &mut Chain,
    exec: &mut dyn FnMut(CtrlCommand) -> bool,
) {
    let mut used_any = false;
    'outer: while !c.broken {
        let disabled = c.queue.disable_notification(&*dma.access());
        if let Err(e) = disabled {
            break_queue(c, interrupt, &format!("ring: {e}"));
            break;
        }
        loop {
            let guard = dma.access();
            let mem: &DmaSpace = &guard;
            let head = match pop_head(&mut c.queue, mem) {
                Ok(Some(h)) => h,
                Ok(None) => break,
                Err(e) => {
                    break_queue(c, interrupt, &format!("avail ring: {e}"));
                    break 'outer;
                }
            };
            if let Err(e) = walk_into(mem, c.queue.desc_table(), c.queue.size(), head, chain) {
                break_queue(c, interrupt, &format!("control chain {head}: {e}"));
                break 'outer;
            }
            let ack = match read_command(mem, chain) {
                Some(cmd) if exec(cmd) => ACK_OK,
                _ => ACK_ERR,
            };
            let Some(status) = chain.writable.first().copied() else {
                break_queue(c, interrupt, "control chain without status byte");
                break 'outer;
            };
            if mem.write_obj(ack, GuestAddress(status.addr)).is_err()
                || c.queue.add_used(mem, head, 1).is_err()
            {
                break_queue(c, interrupt, "control status not writable");
                break 'outer;
            }
            used_any = true;
        }
        // Ask for the next kick (EVENT_IDX: moves avail_event); loop if
        // commands arrived meanwhile.
        let enabled = c.queue.enable_notification(&*dma.access());
        match enabled {
            Ok(true) => continue,
            Ok(false) => break,
            Err(e) => {
                break_queue(c, interrupt, &format!("ring: {e}"));
                break;
            }
        }
    }
    if used_any {
        signal_used(c, &dma.access(), interrupt);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_vq_pairs_set_of_two_bytes_decodes() {
        assert_eq!(
            decode(&[CLASS_MQ, MQ_VQ_PAIRS_SET, 3, 0]),
            Some(CtrlCommand::SetQueuePairs(3))
        );
        assert_eq!(
            decode(&[CLASS_MQ, MQ_VQ_PAIRS_SET, 0, 1]),
            Some(CtrlCommand::SetQueuePairs(256))
        );
        // Short, other class (RX mode), other MQ command (RSS config).
        assert_eq!(decode(&[CLASS_MQ, MQ_VQ_PAIRS_SET, 3]), None);
        assert_eq!(decode(&[0, 0, 1]), None);
        assert_eq!(decode(&[CLASS_MQ, 1, 2, 0]), None);
        assert_eq!(decode(&[]), None);
    }
}
