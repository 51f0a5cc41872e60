//! A vhost-user back-end with a device IOTLB, on real sockets: the
//! front-end channel (UPDATE and INVALIDATE from dmavisor, each
//! acknowledged) and the back-end channel (MISS to dmavisor, answered by
//! `serve_backend_channel`), with its DMA through its own cache.
//!
//! WHY its own cache and threads: what a back-end caches is out of the
//! vIOMMU's hands once sent, so the only thing that keeps it from using a
//! translation after the UNMAP completed is the order of the messages:
//! an UPDATE answered for a miss must never arrive after the INVALIDATE
//! that the UNMAP waited for. This back-end is correct (an INVALIDATE is
//! acknowledged only once no access through what it drops can still be
//! running), so a late access here is dmavisor's fault.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;

use vhost::vhost_user::message::{BackendReq, FrontendReq};
use vm_memory::{ByteValued, Bytes, GuestAddress};
use vmm::vhost_user::iotlb::{IotlbMsg, ACCESS_RW, ACCESS_WO, INVALIDATE, MISS, UPDATE};

use virtio_iommu::locks::Unpoison;

use super::rng::Rng;
use super::{gpa_of, iova, Kind, Shared, REGION, SLOTS};

const FLAG_VERSION_1: u32 = 0x1;
const FLAG_REPLY: u32 = 0x4;
const FLAG_NEED_REPLY: u32 = 0x8;

/// One cached translation: IOVA bytes, host address, permissions.
#[derive(Clone, Copy)]
struct Entry {
    size: u64,
    uaddr: u64,
    perm: u8,
}

/// Translations the back-end's IOTLB holds: a small cache, as a real
/// back-end's is, so that it misses again and again on mapped IOVAs and
/// its misses keep racing the guest's UNMAPs.
const CAPACITY: usize = 4;

/// The back-end's device IOTLB.
#[derive(Default)]
pub struct BackendCache {
    /// First IOVA -> entry. Accesses hold the read lock while they use an
    /// entry, INVALIDATE takes the write lock before it acknowledges.
    entries: RwLock<BTreeMap<u64, Entry>>,
}

fn message(code: u32, flags: u32, body: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(12 + body.len());
    m.extend_from_slice(&code.to_le_bytes());
    m.extend_from_slice(&flags.to_le_bytes());
    m.extend_from_slice(&u32::try_from(body.len()).unwrap().to_le_bytes());
    m.extend_from_slice(body);
    m
}

/// Reads one message: (code, flags, body); None at the end of the stream.
fn read_message(sock: &mut UnixStream) -> Option<(u32, u32, Vec<u8>)> {
    let mut hdr = [0u8; 12];
    sock.read_exact(&mut hdr).ok()?;
    let word = |i: usize| u32::from_le_bytes([hdr[i], hdr[i + 1], hdr[i + 2], hdr[i + 3]]);
    let (code, flags, size) = (word(0), word(4), word(8));
    let mut body = vec![0u8; size as usize];
    sock.read_exact(&mut body).ok()?;
    Some((code, flags, body))
}

fn iotlb_msg(body: &[u8]) -> Option<IotlbMsg> {
    let mut m = IotlbMsg::default();
    let n = m.as_slice().len();
    m.as_mut_slice().copy_from_slice(body.get(..n)?);
    Some(m)
}

impl BackendCache {
    /// The front-end channel until dmavisor closes it (or the test shuts
    /// the socket down): caches UPDATEs, drops what INVALIDATEs cover,
    /// acknowledges what asks for it.
    pub fn serve_frontend(&self, mut sock: UnixStream) {
        while let Some((code, flags, body)) = read_message(&mut sock) {
            let mut status = 1u64;
            if code == u32::from(FrontendReq::IOTLB_MSG) {
                if let Some(m) = iotlb_msg(&body) {
                    status = self.apply(&m);
                }
            }
            if flags & FLAG_NEED_REPLY != 0 {
                let reply = message(code, FLAG_VERSION_1 | FLAG_REPLY, &status.to_le_bytes());
                if sock.write_all(&reply).is_err() {
                    return;
                }
            }
        }
    }

    /// Drops the entry covering `at`, if any.
    fn evict(&self, at: u64) {
        let mut e = self.entries.write().unpoisoned();
        if let Some((&first, x)) = e.range(..=at).next_back() {
            if at - first < x.size {
                e.remove(&first);
            }
        }
    }

    fn apply(&self, m: &IotlbMsg) -> u64 {
        let mut e = self.entries.write().unpoisoned();
        match m.kind {
            UPDATE if m.size > 0 => {
                while e.len() >= CAPACITY {
                    // Evicts the entry at the lowest IOVA other than this.
                    let Some(old) = e.keys().copied().find(|&k| k != m.iova) else {
                        break;
                    };
                    e.remove(&old);
                }
                e.insert(
                    m.iova,
                    Entry {
                        size: m.size,
                        uaddr: m.uaddr,
                        perm: m.perm,
                    },
                );
                0
            }
            INVALIDATE => {
                let last = m.iova.saturating_add(m.size.saturating_sub(1));
                let gone: Vec<u64> = e
                    .range(..=last)
                    .filter(|(&s, x)| s.saturating_add(x.size - 1) >= m.iova)
                    .map(|(&s, _)| s)
                    .collect();
                for s in gone {
                    e.remove(&s);
                }
                0
            }
            _ => 1,
        }
    }
}

/// The back-end's DMA: writes the vhost-user region of random slots of
/// its guest thread through its cache, asking dmavisor on a miss over the
/// back-end channel `channel`, until the run stops (then closes it).
pub fn run(
    shared: &Shared,
    cache: &BackendCache,
    mut channel: UnixStream,
    hint: &AtomicU64,
    mut rng: Rng,
) {
    let stats = shared.kind(Kind::VhostUser);
    while !shared.stopped() {
        let hinted = hint.swap(0, Ordering::Relaxed);
        let at = if hinted != 0 {
            // The guest is about to unmap it: drop it (a back-end may
            // evict any time) so that the access below misses.
            let at = hinted - 1 + Kind::VhostUser.offset();
            cache.evict(at);
            at
        } else {
            iova(rng.below(SLOTS)) + Kind::VhostUser.offset()
        };
        if write_cached(shared, cache, at) {
            stats.accesses.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let miss = IotlbMsg::new(MISS, at, 0, 0, ACCESS_RW);
        let msg = message(
            u32::from(BackendReq::IOTLB_MSG),
            FLAG_VERSION_1 | FLAG_NEED_REPLY,
            miss.as_slice(),
        );
        if channel.write_all(&msg).is_err() {
            return;
        }
        // The reply comes after dmavisor wrote the UPDATE, if there is
        // one; the access is then retried, as a back-end retries the
        // access it missed on (once the UPDATE was read from the socket).
        match read_message(&mut channel) {
            Some((_, _, body)) if body.first() == Some(&0) => {
                for _ in 0..100 {
                    if write_cached(shared, cache, at) {
                        stats.accesses.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                    std::thread::yield_now();
                }
            }
            Some(_) => {
                stats.refused.fetch_add(1, Ordering::Relaxed);
            }
            None => return,
        }
    }
}

/// One write of the region at `at` through a cached translation, holding
/// the cache's read lock; false on a miss.
fn write_cached(shared: &Shared, cache: &BackendCache, at: u64) -> bool {
    let entries = cache.entries.read().unpoisoned();
    let Some((&first, e)) = entries.range(..=at).next_back() else {
        return false;
    };
    let off = at - first;
    if off.saturating_add(REGION) > e.size || !matches!(e.perm, ACCESS_WO | ACCESS_RW) {
        return false;
    }
    let Some(gpa) = gpa_of(shared, e.uaddr + off) else {
        return false;
    };
    let ticket = shared.ticket();
    let buf: Vec<u8> = (0..REGION / 8).flat_map(|_| ticket.to_le_bytes()).collect();
    shared.mem.write_slice(&buf, GuestAddress(gpa)).is_ok()
}
