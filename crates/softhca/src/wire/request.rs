//! A plain request packet's headers, kept between packets.
//!
//! A requester's packets of one shape (the IP and UDP headers of its route, a BTH with the
//! same opcode, flags, P_Key and destination QP, the same payload length, no extended header:
//! the Sends of a ping-pong, the middle packets of a long Write) differ in their headers only
//! by the PSN. Building each from the generic representation (a [`super::PacketRepr`] with every
//! extended header an `Option`, the IP and UDP headers and checksum, the ICRC over the masked
//! headers) cost an 8-byte Send some 1,000 of its 1,500 instructions. [`RequestHead`] keeps
//! the headers the ordinary emitter wrote for one packet and the ICRC's CRC over them up to
//! the PSN: the next packet of that shape is a copy, three bytes written and the CRC
//! continued over them, as [`super::AckTemplate`] does for ACKs.

use super::bth::{BthRepr, BTH_PSN};
use super::field::set_u24;
use super::icrc;
use super::ip::{IPV6_HEADER_LEN, UDP_HEADER_LEN};
use super::packet::BTH_LEN;
use super::psn::Psn;
use super::roce::{IpRepr, UdpRepr};
use super::{check_len, WireError};
use crate::mem::crc32::update;

/// The longest headers of a plain request: IPv6, UDP, BTH.
const MAX_LEN: usize = IPV6_HEADER_LEN + UDP_HEADER_LEN + BTH_LEN;

/// The PSN's bytes, the last of the BTH.
const PSN_LEN: usize = BTH_LEN - BTH_PSN;

/// The headers of a request packet that is a BTH and a payload and nothing else, for one IP
/// header, UDP header, BTH (its PSN aside) and payload length. [`write`](Self::write) writes
/// them with a PSN; [`is_for`](Self::is_for) says whether they are still the ones to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHead {
    ip: IpRepr,
    udp: UdpRepr,
    /// The BTH they were written for, PSN 0.
    bth: BthRepr,
    payload_len: u32,
    bytes: [u8; MAX_LEN],
    len: u8,
    /// The ICRC's CRC over the masked headers up to the PSN.
    crc_before_psn: u32,
}

impl RequestHead {
    /// Keeps `head`, the headers through the BTH that the ordinary emitter
    /// ([`super::RoceRepr::emit_headers`]) wrote for `ip`, `udp`, `bth` with no extended header
    /// and a payload of `payload_len` bytes, sealed or not: the UDP checksum, which is all the
    /// seal changes in them, is masked by the ICRC and written anew by the next seal. Fails for
    /// headers of another length.
    pub fn new(ip: IpRepr, udp: UdpRepr, bth: BthRepr, payload_len: usize, head: &[u8]) -> Result<Self, WireError> {
        let len = ip.header_len() + UDP_HEADER_LEN + BTH_LEN;
        if head.len() != len {
            return Err(WireError::BadLength);
        }
        let payload_len = u32::try_from(payload_len).map_err(|_| WireError::BadLength)?;
        let mut bytes = [0u8; MAX_LEN];
        bytes[..len].copy_from_slice(head);
        let crc_before_psn = icrc::start_before_psn(head)?;
        Ok(RequestHead {
            ip,
            udp,
            bth: BthRepr { psn: Psn::new(0), ..bth },
            payload_len,
            bytes,
            len: len as u8,
            crc_before_psn,
        })
    }

    /// Whether these are the headers for `ip`, `udp`, `bth` (its PSN aside) and a payload of
    /// `payload_len` bytes.
    pub fn is_for(&self, ip: &IpRepr, udp: &UdpRepr, bth: &BthRepr, payload_len: usize) -> bool {
        self.payload_len as usize == payload_len
            && self.bth == BthRepr { psn: Psn::new(0), ..*bth }
            && self.udp == *udp
            && self.ip == *ip
    }

    /// Writes the headers with `psn` into the start of `buf` and returns their length and the
    /// ICRC's CRC over them: the bytes and the CRC the ordinary emitter gives for that packet
    /// (the UDP checksum aside, which the caller's seal writes). Nothing after them is
    /// touched: the caller writes the payload and zeroes the pad.
    pub fn write(&self, psn: Psn, buf: &mut [u8]) -> Result<(usize, u32), WireError> {
        let len = usize::from(self.len);
        check_len(buf, len)?;
        let head = &mut buf[..len];
        head.copy_from_slice(&self.bytes[..len]);
        set_u24(head, len - PSN_LEN, psn.value());
        Ok((len, update(self.crc_before_psn, &head[len - PSN_LEN..])))
    }

    /// The IP header the headers were written for (the datagram is sealed for it).
    pub fn ip(&self) -> &IpRepr {
        &self.ip
    }

    /// The UDP header they were written for.
    pub fn udp(&self) -> &UdpRepr {
        &self.udp
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::opcode::Opcode;
    use crate::wire::packet::PacketRepr;
    use crate::wire::roce::{Ipv4Repr, RoceRepr, UdpChecksum};

    /// A copy with another PSN is byte for byte what the emitter writes for that PSN, and its
    /// CRC is the ICRC's over those headers.
    #[test]
    fn a_copy_with_another_psn_is_what_the_emitter_writes() {
        let ip = IpRepr::V4(Ipv4Repr::new([10, 0, 0, 1].into(), [10, 0, 0, 2].into()));
        let udp = UdpRepr::for_qp(0x11, UdpChecksum::default_for(&ip));
        let bth = |psn| BthRepr { ack_req: true, ..BthRepr::new(Opcode::RcSendOnly, 0xffff, 0x42, Psn::new(psn)) };
        let emit = |psn, buf: &mut [u8]| {
            let range = RoceRepr { ip, udp, packet: PacketRepr::new(bth(psn)) }.emit_headers(8, buf).unwrap();
            range.start
        };
        let mut first = [0u8; 256];
        let n = emit(5, &mut first);
        let head = RequestHead::new(ip, udp, bth(5), 8, &first[..n]).unwrap();
        assert!(head.is_for(&ip, &udp, &bth(0xff_ffff), 8));
        assert!(!head.is_for(&ip, &udp, &bth(5), 12));
        for psn in [0, 6, 0x12_3456, 0xff_ffff] {
            let mut want = [0u8; 256];
            let m = emit(psn, &mut want);
            let mut got = [0u8; 256];
            let (len, crc) = head.write(Psn::new(psn), &mut got).unwrap();
            assert_eq!((len, &got[..len]), (m, &want[..m]), "PSN {psn:#x}");
            assert_eq!(crc, icrc::start_datagram(&want[..m]).unwrap(), "PSN {psn:#x}");
        }
    }
}
