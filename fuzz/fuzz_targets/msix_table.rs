//! Fuzzes the MSI-X table and pending-bit array of an emulated function
//! as a hostile guest programs them: table reads and writes of every
//! width at every offset (inside and past the table), PBA reads,
//! enable and function-mask flips, entry masks, interrupts the device
//! raises and ones that reach a vector from outside (an assigned
//! function's, signalled straight into its irqfd).
//!
//! Input: [vector count][ops of 8 bytes: kind, vector, offset, len,
//! value (4 bytes)].
//!
//! Invariants beyond "no panic", against a model of the table: no vector
//! delivers while MSI-X is off, the function is masked or its entry is
//! masked; a vector's sink is closed whenever it may not deliver; what is
//! delivered goes to the message the entry holds; a signal held back is
//! pending in the PBA and delivered exactly once when the vector opens;
//! table reads return what was written (vector control keeps only the
//! mask bit); nothing past the table or the PBA changes or answers.
#![no_main]

use std::sync::{Arc, Mutex};

use libfuzzer_sys::fuzz_target;
use vmm::interrupt::{InterruptError, MsiMessage};
use vmm::virtio::msix::{MsiSink, MsixState, MSIX_ENABLE, MSIX_FUNCTION_MASK};

/// What the fake vectors did, shared with the target.
#[derive(Default)]
struct Log {
    /// Per vector: the message it routes to.
    routes: Vec<Option<MsiMessage>>,
    /// Per vector: closed by `set_masked(true)`.
    closed: Vec<bool>,
    /// Per vector: an outside signal held while closed.
    held: Vec<bool>,
    /// Deliveries: (vector, message), by trigger or by an open sink.
    delivered: Vec<(usize, Option<MsiMessage>)>,
}

struct Sink {
    v: usize,
    log: Arc<Mutex<Log>>,
}

impl MsiSink for Sink {
    fn route(&mut self, msg: MsiMessage) -> Result<(), InterruptError> {
        self.log.lock().unwrap().routes[self.v] = Some(msg);
        Ok(())
    }
    fn trigger(&self) {
        let mut l = self.log.lock().unwrap();
        let m = l.routes[self.v];
        l.delivered.push((self.v, m));
    }
    fn set_masked(&mut self, masked: bool) -> Result<(), InterruptError> {
        self.log.lock().unwrap().closed[self.v] = masked;
        Ok(())
    }
    fn take_signals(&mut self) -> bool {
        std::mem::take(&mut self.log.lock().unwrap().held[self.v])
    }
}

/// The guest's view of the table.
struct Model {
    table: Vec<[u8; 16]>,
    pending: Vec<bool>,
    enabled: bool,
    fmask: bool,
}

impl Model {
    fn masked(&self, v: usize) -> bool {
        !self.enabled || self.fmask || self.table[v][12] & 1 != 0
    }
    fn message(&self, v: usize) -> MsiMessage {
        let e = &self.table[v];
        let w = |i: usize| u32::from_le_bytes([e[i], e[i + 1], e[i + 2], e[i + 3]]);
        MsiMessage {
            addr: u64::from(w(0)) | (u64::from(w(4)) << 32),
            data: w(8),
        }
    }
    /// A vector that became deliverable fires what was pending.
    fn release(&mut self, v: usize, expect: &mut Vec<usize>) {
        if !self.masked(v) && self.pending[v] {
            self.pending[v] = false;
            expect.push(v);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&n, ops)) = data.split_first() else {
        return;
    };
    let n = usize::from(n % 70) + 1;
    let log = Arc::new(Mutex::new(Log {
        routes: vec![None; n],
        closed: vec![false; n],
        held: vec![false; n],
        delivered: Vec::new(),
    }));
    let sinks: Vec<Box<dyn MsiSink>> = (0..n)
        .map(|v| {
            Box::new(Sink {
                v,
                log: log.clone(),
            }) as Box<dyn MsiSink>
        })
        .collect();
    let mut s = MsixState::new(sinks);
    let mut m = Model {
        table: vec![[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]; n],
        pending: vec![false; n],
        enabled: false,
        fmask: false,
    };
    let table_len = n as u64 * 16;
    let pba_len = n.div_ceil(64) as u64 * 8;
    for op in ops.chunks_exact(8) {
        let v = usize::from(op[1]) % n;
        let value = [op[4], op[5], op[6], op[7]];
        let mut expect: Vec<usize> = Vec::new();
        match op[0] % 6 {
            // Table write of 1..=8 bytes anywhere (mostly inside).
            0 | 1 => {
                let len = usize::from(op[3] % 8) + 1;
                let offset = (v as u64) * 16 + u64::from(op[2] % 20);
                let mut bytes = [0u8; 8];
                bytes[..4].copy_from_slice(&value);
                bytes[4..].copy_from_slice(&value);
                s.write_table(offset, &bytes[..len]);
                let start = (offset % 16) as usize;
                // Past the last entry the write reaches nothing.
                let v = (offset / 16) as usize;
                if v < n && start + len <= 16 {
                    m.table[v][start..start + len].copy_from_slice(&bytes[..len]);
                    m.table[v][12] &= 1;
                    m.table[v][13..16].fill(0);
                    m.release(v, &mut expect);
                }
            }
            // Table read: what the model holds, zeros past the table.
            2 => {
                let len = usize::from(op[3] % 8) + 1;
                let offset = u64::from(u16::from_le_bytes([op[2], op[4]])) % (table_len + 32);
                let mut got = vec![0xaau8; len];
                s.read_table(offset, &mut got);
                let v = (offset / 16) as usize;
                let start = (offset % 16) as usize;
                match m.table.get(v) {
                    Some(e) if start + len <= 16 => {
                        assert_eq!(got, e[start..start + len], "table read at {offset:#x}")
                    }
                    _ => assert!(
                        got.iter().all(|b| *b == 0),
                        "read past an entry at {offset:#x}"
                    ),
                }
            }
            // Message control.
            3 => {
                let ctrl = (u16::from(op[2] & 1) * MSIX_ENABLE)
                    | (u16::from(op[3] & 1) * MSIX_FUNCTION_MASK);
                s.set_control(ctrl);
                m.enabled = ctrl & MSIX_ENABLE != 0;
                m.fmask = ctrl & MSIX_FUNCTION_MASK != 0;
                for v in 0..n {
                    m.release(v, &mut expect);
                }
            }
            // The device raises a vector (also out of range).
            4 => {
                let raw = u16::from_le_bytes([op[1], op[2]]) % (n as u16 + 3);
                s.signal(raw);
                let r = usize::from(raw);
                if r < n && m.enabled {
                    if m.masked(r) {
                        m.pending[r] = true;
                    } else {
                        expect.push(r);
                    }
                }
            }
            // A signal from outside: delivered if the sink is open, held if not.
            _ => {
                let mut l = log.lock().unwrap();
                if l.closed[v] {
                    l.held[v] = true;
                } else {
                    assert!(!m.masked(v), "vector {v} open while masked");
                    let msg = l.routes[v];
                    l.delivered.push((v, msg));
                    expect.push(v);
                }
            }
        }
        // Deliveries match the model and go to the entry's message.
        let delivered = std::mem::take(&mut log.lock().unwrap().delivered);
        let mut got: Vec<usize> = delivered.iter().map(|d| d.0).collect();
        for (v, msg) in &delivered {
            assert!(!m.masked(*v), "vector {v} delivered while masked");
            assert_eq!(
                *msg,
                Some(m.message(*v)),
                "vector {v} delivered to a stale message"
            );
        }
        got.sort_unstable();
        expect.sort_unstable();
        assert_eq!(got, expect, "deliveries differ from the model");
        // Sinks of vectors that may not deliver are closed.
        {
            let l = log.lock().unwrap();
            for v in 0..n {
                if m.masked(v) {
                    assert!(
                        l.closed[v],
                        "vector {v} may not deliver but its sink is open"
                    );
                }
            }
        }
        // The PBA: a model-pending bit is set; held outside signals may add bits.
        let mut pba = vec![0u8; pba_len as usize + 8];
        s.read_pba(0, &mut pba);
        let l = log.lock().unwrap();
        for v in 0..n {
            let bit = pba[v / 8] >> (v % 8) & 1 != 0;
            if m.pending[v] {
                assert!(bit, "vector {v} pending but not in the PBA");
            }
            if bit && !m.pending[v] {
                // Collected from a held outside signal.
                assert!(
                    m.masked(v),
                    "vector {v} pending in the PBA while deliverable"
                );
                m.pending[v] = true;
            }
            assert!(
                !l.held[v],
                "vector {v}: a held signal not collected by the PBA read"
            );
        }
        assert!(
            pba[pba_len as usize..].iter().all(|b| *b == 0),
            "PBA bits past the table"
        );
    }
});
