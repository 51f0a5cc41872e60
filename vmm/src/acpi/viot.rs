//! The ACPI VIOT (Virtual I/O Translation) table.
//!
//! Why: a guest kernel only puts a PCI endpoint behind a virtio-iommu once
//! firmware tells it which IOMMU translates which requester IDs; on x86 that
//! is the VIOT table (Linux `CONFIG_ACPI_VIOT`). Without it the in-tree
//! `virtio_iommu` driver binds but manages no endpoint.
//!
//! Layout (ACPI 6.4+, "Virtual I/O Translation Table"), little endian:
//!
//! ```text
//! 0   36  standard header, signature "VIOT", revision 0
//! 36   2  node count
//! 38   2  offset of the first node from the start of the table (48)
//! 40   8  reserved
//! 48      nodes
//!
//! virtio-pci IOMMU node (type 3), 16 bytes:
//!   0 type, 1 reserved, 2 length (le16), 4 PCI segment (le16),
//!   6 PCI BDF of the IOMMU (le16), 8 reserved (8)
//! PCI range node (type 1), 24 bytes:
//!   0 type, 1 reserved, 2 length, 4 endpoint start (le32),
//!   8 segment start, 10 segment end, 12 BDF start, 14 BDF end,
//!   16 output node (offset of the IOMMU node from the table start),
//!   18 reserved (6)
//! ```
//!
//! Endpoint ids are the BDF (`endpoint start` = first BDF of the range),
//! which is what the VMM registers with the device model via
//! `IommuDevice::add_endpoint(bdf)`.

use acpi_tables::sdt::Sdt;

use super::{OEM_ID, OEM_REVISION, OEM_TABLE_ID};
use crate::pci::PciAddress;
use crate::width::{const_u16, const_u32};

/// Size of the VIOT header including node count/offset and reserved bytes.
pub const VIOT_HEADER_LEN: usize = 48;
/// The header length in the table's own 16- and 32-bit fields.
const HEADER_LEN_U16: u16 = const_u16(VIOT_HEADER_LEN as i128);
const HEADER_LEN_U32: u32 = const_u32(VIOT_HEADER_LEN as i128);
/// Node type: PCI range.
pub const NODE_PCI_RANGE: u8 = 1;
/// Node type: virtio-pci IOMMU.
pub const NODE_VIRTIO_PCI_IOMMU: u8 = 3;
/// Length of a PCI range node.
pub const PCI_RANGE_LEN: u16 = 24;
/// Length of a virtio-pci IOMMU node.
pub const VIRTIO_PCI_IOMMU_LEN: u16 = 16;

/// Which requester IDs one virtio-pci IOMMU translates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViotConfig {
    /// PCI segment of the IOMMU and its endpoints (the VMM has one: 0).
    pub segment: u16,
    /// Address of the virtio-iommu PCI function.
    pub iommu: PciAddress,
    /// Endpoints behind it (any order, duplicates ignored).
    pub endpoints: Vec<PciAddress>,
}

/// The 16-bit requester id (bus << 8 | device << 3 | function).
pub fn bdf(addr: PciAddress) -> u16 {
    (u16::from(addr.bus) << 8) | (u16::from(addr.device & 0x1f) << 3) | u16::from(addr.function & 7)
}

/// Groups sorted, deduplicated requester ids into contiguous inclusive ranges,
/// so adjacent endpoints share one node.
fn ranges(mut ids: Vec<u16>) -> Vec<(u16, u16)> {
    ids.sort_unstable();
    ids.dedup();
    let mut out: Vec<(u16, u16)> = Vec::new();
    for id in ids {
        match out.last_mut() {
            Some((_, end)) if end.checked_add(1) == Some(id) => *end = id,
            _ => out.push((id, id)),
        }
    }
    out
}

/// Builds the table: one virtio-pci IOMMU node, then one PCI range node per
/// contiguous run of endpoint BDFs, each pointing at the IOMMU node.
pub fn build_viot(cfg: &ViotConfig) -> Vec<u8> {
    let runs = ranges(cfg.endpoints.iter().map(|a| bdf(*a)).collect());
    let mut viot = Sdt::new(
        *b"VIOT",
        HEADER_LEN_U32,
        0,
        OEM_ID,
        OEM_TABLE_ID,
        OEM_REVISION,
    );
    let node_count = u16::try_from(runs.len().saturating_add(1)).unwrap_or(u16::MAX);
    viot.write_bytes(36, &node_count.to_le_bytes());
    viot.write_bytes(38, &HEADER_LEN_U16.to_le_bytes());

    // The IOMMU node comes first, so its offset is the header length.
    let iommu_offset = HEADER_LEN_U16;
    let mut node = vec![NODE_VIRTIO_PCI_IOMMU, 0];
    node.extend_from_slice(&VIRTIO_PCI_IOMMU_LEN.to_le_bytes());
    node.extend_from_slice(&cfg.segment.to_le_bytes());
    node.extend_from_slice(&bdf(cfg.iommu).to_le_bytes());
    node.extend_from_slice(&[0; 8]);
    viot.append_slice(&node);

    for (first, last) in runs {
        let mut node = vec![NODE_PCI_RANGE, 0];
        node.extend_from_slice(&PCI_RANGE_LEN.to_le_bytes());
        node.extend_from_slice(&u32::from(first).to_le_bytes());
        node.extend_from_slice(&cfg.segment.to_le_bytes());
        node.extend_from_slice(&cfg.segment.to_le_bytes());
        node.extend_from_slice(&first.to_le_bytes());
        node.extend_from_slice(&last.to_le_bytes());
        node.extend_from_slice(&iommu_offset.to_le_bytes());
        node.extend_from_slice(&[0; 6]);
        viot.append_slice(&node);
    }
    viot.as_slice().to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(device: u8) -> PciAddress {
        PciAddress {
            bus: 0,
            device,
            function: 0,
        }
    }

    fn u16_at(b: &[u8], off: usize) -> u16 {
        u16::from_le_bytes([b[off], b[off + 1]])
    }

    fn u32_at(b: &[u8], off: usize) -> u32 {
        u32::from_le_bytes(b[off..off + 4].try_into().unwrap())
    }

    /// Walks the nodes the way a guest does: from the node offset, by each
    /// node's length.
    fn nodes(t: &[u8]) -> Vec<&[u8]> {
        let mut off = usize::from(u16_at(t, 38));
        let mut v = Vec::new();
        for _ in 0..u16_at(t, 36) {
            let len = usize::from(u16_at(t, off + 2));
            v.push(&t[off..off + len]);
            off += len;
        }
        assert_eq!(off, t.len(), "nodes end exactly at the table end");
        v
    }

    #[test]
    fn bdf_encoding() {
        assert_eq!(bdf(at(3)), 0x18);
        assert_eq!(
            bdf(PciAddress {
                bus: 1,
                device: 31,
                function: 7
            }),
            0x1ff
        );
    }

    #[test]
    fn header_length_and_checksum() {
        let t = build_viot(&ViotConfig {
            segment: 0,
            iommu: at(2),
            endpoints: vec![at(3), at(5)],
        });
        assert_eq!(&t[0..4], b"VIOT");
        assert_eq!(u32_at(&t, 4) as usize, t.len());
        assert_eq!(t.len(), 48 + 16 + 2 * 24);
        assert_eq!(t.iter().fold(0u8, |a, x| a.wrapping_add(*x)), 0);
        assert_eq!(u16_at(&t, 36), 3);
        assert_eq!(u16_at(&t, 38), 48);
        assert_eq!(&t[40..48], &[0; 8]);
    }

    #[test]
    fn iommu_node_and_ranges_point_at_it() {
        let t = build_viot(&ViotConfig {
            segment: 0,
            iommu: at(2),
            endpoints: vec![
                at(9),
                at(3),
                PciAddress {
                    bus: 0,
                    device: 3,
                    function: 1,
                },
                at(9),
            ],
        });
        let n = nodes(&t);
        assert_eq!(n.len(), 3, "03.0-03.1 share a range; 09.0 alone");
        let iommu = n[0];
        assert_eq!(iommu[0], NODE_VIRTIO_PCI_IOMMU);
        assert_eq!(u16_at(iommu, 2), 16);
        assert_eq!(u16_at(iommu, 4), 0);
        assert_eq!(u16_at(iommu, 6), 0x10);
        let expect = [(0x18u16, 0x19u16), (0x48, 0x48)];
        for (node, (first, last)) in n[1..].iter().zip(expect) {
            assert_eq!(node[0], NODE_PCI_RANGE);
            assert_eq!(u16_at(node, 2), 24);
            assert_eq!(u32_at(node, 4), u32::from(first), "endpoint id = BDF");
            assert_eq!(u16_at(node, 8), 0);
            assert_eq!(u16_at(node, 10), 0);
            assert_eq!(u16_at(node, 12), first);
            assert_eq!(u16_at(node, 14), last);
            assert_eq!(u16_at(node, 16), 48, "output node = IOMMU node offset");
            assert_eq!(&node[18..24], &[0; 6]);
        }
    }

    #[test]
    fn adjacent_devices_with_functions_are_not_merged_across_gaps() {
        // 00:03.0 (0x18) and 00:04.0 (0x20) are not adjacent BDFs: the
        // functions 00:03.1-7 in between must not be claimed.
        let r = ranges(vec![0x18, 0x20]);
        assert_eq!(r, vec![(0x18, 0x18), (0x20, 0x20)]);
        assert_eq!(ranges(vec![0x18, 0x19, 0x1a]), vec![(0x18, 0x1a)]);
        assert_eq!(ranges(vec![0xffff, 0xfffe]), vec![(0xfffe, 0xffff)]);
    }

    #[test]
    fn no_endpoints_is_just_the_iommu() {
        let t = build_viot(&ViotConfig {
            segment: 0,
            iommu: at(1),
            endpoints: vec![],
        });
        assert_eq!(nodes(&t).len(), 1);
        assert_eq!(t.iter().fold(0u8, |a, x| a.wrapping_add(*x)), 0);
    }
}
