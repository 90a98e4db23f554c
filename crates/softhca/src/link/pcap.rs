//! A pcap tap for links: every datagram becomes one Ethernet II record, so Wireshark's RoCEv2
//! dissector (UDP port 4791) decodes it without configuration.
//!
//! softhca has no real link layer, so the tap invents one: a fixed, locally administered MAC per
//! device index ([`mac_for_index`]), and the ethertype taken from the IP version nibble.

use std::io::{self, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::wire::pcap::PcapWriter;
use crate::wire::roce::{ETHERNET_HEADER_LEN, ETHERTYPE_IPV4, ETHERTYPE_IPV6};

/// The MAC of a station the link does not know (an injected packet from a foreign address, or a
/// destination with no device). Locally administered, never a device's.
pub const UNKNOWN_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0];

/// The MAC the tap shows for the device at `index` (0-based): `02:00:00:xx:xx:xx` holding
/// `index + 1`, so devices 0 and 1 match `wire::roce::MAC_A` and `MAC_B`.
pub fn mac_for_index(index: usize) -> [u8; 6] {
    // Indices past 2^24 - 1 cannot be told apart; no test creates that many devices.
    let n = (index as u32).wrapping_add(1) & 0x00ff_ffff;
    let [_, a, b, c] = n.to_be_bytes();
    [0x02, 0, 0, a, b, c]
}

/// Frames IP datagrams as Ethernet II and writes them to a pcap stream.
#[derive(Debug)]
pub struct PcapTap<W: Write> {
    writer: PcapWriter<W>,
    /// Reused for every frame so tapping does not allocate per packet.
    frame: Vec<u8>,
}

impl<W: Write> PcapTap<W> {
    /// Writes the pcap file header (linktype Ethernet).
    pub fn new(out: W) -> io::Result<Self> {
        Ok(PcapTap { writer: PcapWriter::new(out)?, frame: Vec::new() })
    }

    /// Appends `datagram` (from its IP header on) as one Ethernet frame stamped `now_ns`
    /// nanoseconds after the epoch of the capture (pcap keeps microseconds).
    pub fn write_datagram(
        &mut self,
        now_ns: u64,
        src_mac: [u8; 6],
        dst_mac: [u8; 6],
        datagram: &[u8],
    ) -> io::Result<()> {
        // Garbage injected by a test has no IP version; label it IPv4 so Wireshark still shows
        // it (as malformed) instead of an unknown ethertype.
        let ethertype = match datagram.first().map(|b| b >> 4) {
            Some(6) => ETHERTYPE_IPV6,
            _ => ETHERTYPE_IPV4,
        };
        self.frame.clear();
        self.frame.extend_from_slice(&dst_mac);
        self.frame.extend_from_slice(&src_mac);
        self.frame.extend_from_slice(&ethertype.to_be_bytes());
        debug_assert_eq!(self.frame.len(), ETHERNET_HEADER_LEN);
        self.frame.extend_from_slice(datagram);
        self.writer.write_packet(Duration::from_nanos(now_ns), &self.frame)
    }

    /// Appends an Ethernet frame as it is (a Raw Ethertype QP's packet).
    pub fn write_frame(&mut self, now_ns: u64, frame: &[u8]) -> io::Result<()> {
        self.writer.write_packet(Duration::from_nanos(now_ns), frame)
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.writer.flush()
    }

    pub fn get_ref(&self) -> &W {
        self.writer.get_ref()
    }

    pub fn into_inner(self) -> W {
        self.writer.into_inner()
    }
}

/// A cloneable in-memory `Write` sink, so a test can hand a tap to a link and still read what
/// was written.
#[derive(Debug, Clone, Default)]
pub struct SharedBuf(Arc<Mutex<Vec<u8>>>);

impl SharedBuf {
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy of everything written so far.
    pub fn contents(&self) -> Vec<u8> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Write for SharedBuf {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
