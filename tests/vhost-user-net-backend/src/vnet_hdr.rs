//! The virtio-net header that precedes every frame on both queues.
//!
//! The TAP is opened *without* `IFF_VNET_HDR`, so this back-end owns the
//! header instead of the kernel: the header a guest puts in front of a
//! transmitted frame (which could ask for GSO or checksum work we never
//! offered) is stripped here and never reaches the kernel, and every received
//! frame gets a header built here. With no offloads negotiated the only
//! field that carries information is `num_buffers`, so the header is plain
//! bytes rather than a bindgen struct with unions.

use thiserror::Error;
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_net::VIRTIO_NET_F_MRG_RXBUF;

/// `struct virtio_net_hdr_v1`: flags, gso_type, hdr_len, gso_size,
/// csum_start, csum_offset, num_buffers. Virtio 1.x always uses this size,
/// whether or not `VIRTIO_NET_F_MRG_RXBUF` was negotiated.
pub const HDR_LEN_V1: usize = 12;

/// The legacy header (no `num_buffers`), used only if a front-end did not
/// negotiate `VIRTIO_F_VERSION_1` (nor `MRG_RXBUF`).
pub const HDR_LEN_LEGACY: usize = 10;

/// The longest frame passed in either direction: the largest MTU a TAP
/// accepts (65535) plus an Ethernet header and one VLAN tag. Anything longer
/// cannot be a frame the TAP would take or give, so a transmit chain
/// claiming more is treated as bad rather than copied.
pub const MAX_FRAME_LEN: usize = 65_535 + 14 + 4;

/// Why a transmit chain cannot hold a frame.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum TxLenError {
    /// The chain is shorter than the header, or holds only the header.
    #[error("chain of {total} bytes holds no frame after a {hdr_len}-byte header")]
    NoFrame { total: usize, hdr_len: usize },
    /// The frame after the header is longer than any frame a TAP takes.
    #[error("frame of {frame_len} bytes exceeds the maximum of {MAX_FRAME_LEN}")]
    TooLong { frame_len: usize },
}

/// Header length for the features the front-end acknowledged.
///
/// The brief fixes 12 bytes because dmavisor negotiates `VERSION_1`; the
/// legacy case is handled only so that a front-end which does not negotiate
/// it gets correctly framed packets instead of frames shifted by two bytes.
pub fn hdr_len(acked_features: u64) -> usize {
    let v1 = acked_features & (1u64 << VIRTIO_F_VERSION_1) != 0;
    let mrg = acked_features & (1u64 << VIRTIO_NET_F_MRG_RXBUF) != 0;
    if v1 || mrg {
        HDR_LEN_V1
    } else {
        HDR_LEN_LEGACY
    }
}

/// Length of the frame carried by a transmit chain whose readable part is
/// `total` bytes long, after checking it against the header and the maximum.
pub fn tx_frame_len(total: usize, hdr_len: usize) -> Result<usize, TxLenError> {
    let frame_len = match total.checked_sub(hdr_len) {
        Some(n) if n > 0 => n,
        _ => return Err(TxLenError::NoFrame { total, hdr_len }),
    };
    if frame_len > MAX_FRAME_LEN {
        return Err(TxLenError::TooLong { frame_len });
    }
    Ok(frame_len)
}

/// The header written in front of every received frame: all zeroes (no
/// checksum or GSO information, since none was offered) except
/// `num_buffers = 1`, because without `MRG_RXBUF` each frame occupies exactly
/// one descriptor chain. Callers use the first [`hdr_len`] bytes.
pub fn rx_header() -> [u8; HDR_LEN_V1] {
    let mut hdr = [0u8; HDR_LEN_V1];
    // num_buffers is a little-endian u16 at offset 10.
    hdr[10..12].copy_from_slice(&1u16.to_le_bytes());
    hdr
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_length_follows_negotiated_features() {
        assert_eq!(hdr_len(1 << VIRTIO_F_VERSION_1), HDR_LEN_V1);
        assert_eq!(hdr_len(1 << VIRTIO_NET_F_MRG_RXBUF), HDR_LEN_V1);
        assert_eq!(hdr_len(0), HDR_LEN_LEGACY);
    }

    #[test]
    fn rx_header_is_zero_except_num_buffers() {
        let hdr = rx_header();
        assert_eq!(&hdr[..10], &[0u8; 10]);
        assert_eq!(u16::from_le_bytes([hdr[10], hdr[11]]), 1);
    }

    #[test]
    fn tx_frame_length_is_bounds_checked() {
        assert_eq!(tx_frame_len(12 + 60, 12), Ok(60));
        assert_eq!(tx_frame_len(12 + MAX_FRAME_LEN, 12), Ok(MAX_FRAME_LEN));
        assert_eq!(
            tx_frame_len(12, 12),
            Err(TxLenError::NoFrame {
                total: 12,
                hdr_len: 12
            })
        );
        assert_eq!(
            tx_frame_len(5, 12),
            Err(TxLenError::NoFrame {
                total: 5,
                hdr_len: 12
            })
        );
        assert_eq!(
            tx_frame_len(13 + MAX_FRAME_LEN, 12),
            Err(TxLenError::TooLong {
                frame_len: MAX_FRAME_LEN + 1
            })
        );
        assert_eq!(
            tx_frame_len(usize::MAX, 12),
            Err(TxLenError::TooLong {
                frame_len: usize::MAX - 12
            })
        );
    }
}
