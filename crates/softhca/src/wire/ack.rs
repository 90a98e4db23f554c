//! An acknowledgement's datagram, kept whole between packets.
//!
//! A responder owes an ACK for every message it receives (PKT-ACK-2), and on a connected QP
//! each ACK differs from the last only in its PSN, its AETH (syndrome and MSN) and what those
//! change: the ICRC and, where one is sent, the UDP checksum. Building one field by field
//! (IP and UDP headers, the BTH from the opcode table, the ICRC over the masked headers) cost
//! as much as emitting a request, on the round trip of every latency-bound message.
//! [`AckTemplate`] builds the datagram once with the ordinary emitter, so its bytes are the
//! ones that emitter sends, and keeps the ICRC's CRC over everything before the PSN: an ACK is
//! then a copy of the template, seven bytes written and the CRC continued over those seven.

use super::aeth::{Aeth, AethRepr, Syndrome};
use super::bth::{BthRepr, BTH_PSN};
use super::field::set_u24;
use super::icrc;
use super::ip::{IPV6_HEADER_LEN, UDP_HEADER_LEN};
use super::packet::{PacketRepr, BTH_LEN, ICRC_LEN};
use super::psn::Psn;
use super::roce::{seal_with, IpRepr, RoceRepr, UdpRepr};
use super::{check_len, WireError};
use crate::mem::crc32::update;

/// The longest datagram of a BTH and an AETH alone: IPv6, UDP, BTH, AETH, ICRC.
const MAX_LEN: usize = IPV6_HEADER_LEN + UDP_HEADER_LEN + BTH_LEN + AethRepr::LEN + ICRC_LEN;

/// Bytes from the PSN through the AETH: the ones an ACK changes that its ICRC covers.
const CHANGING: usize = BTH_LEN - BTH_PSN + AethRepr::LEN;

/// The datagram of a packet that is a BTH and an AETH and nothing else (an RC Acknowledge),
/// for one IP header, UDP header and BTH (its PSN aside). [`emit`](Self::emit) writes it with
/// a PSN and an AETH; [`is_for`](Self::is_for) says whether it is still the one to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckTemplate {
    ip: IpRepr,
    udp: UdpRepr,
    /// The BTH it was built for, PSN 0.
    bth: BthRepr,
    bytes: [u8; MAX_LEN],
    len: u8,
    /// Where the BTH's PSN is in `bytes`.
    psn_at: u8,
    /// The ICRC's CRC over the masked headers up to the PSN.
    crc_before_psn: u32,
}

impl AckTemplate {
    /// Builds the template for packets under `ip` and `udp` with `bth` (whose PSN does not
    /// matter). Fails where the ordinary emitter fails, and for an opcode whose packet is not
    /// a BTH and an AETH alone.
    pub fn new(ip: IpRepr, udp: UdpRepr, bth: BthRepr) -> Result<Self, WireError> {
        let bth = BthRepr { psn: Psn::new(0), ..bth };
        let mut packet = PacketRepr::new(bth);
        packet.aeth = Some(AethRepr { syndrome: Syndrome::ACK_NO_CREDITS, msn: 0 });
        let mut bytes = [0u8; MAX_LEN];
        let len = RoceRepr { ip, udp, packet }.emit(&mut bytes)?;
        let psn_at = ip.header_len() + UDP_HEADER_LEN + BTH_PSN;
        if len != psn_at + CHANGING + ICRC_LEN {
            return Err(WireError::BadLength);
        }
        let crc_before_psn = icrc::start_before_psn(&bytes[..psn_at + BTH_LEN - BTH_PSN])?;
        Ok(AckTemplate { ip, udp, bth, bytes, len: len as u8, psn_at: psn_at as u8, crc_before_psn })
    }

    /// Whether this template is the one for `ip`, `udp` and `bth` (its PSN aside).
    pub fn is_for(&self, ip: &IpRepr, udp: &UdpRepr, bth: &BthRepr) -> bool {
        self.ip == *ip && self.udp == *udp && self.bth == BthRepr { psn: Psn::new(0), ..*bth }
    }

    /// Writes the datagram with `psn` and `aeth` into the start of `buf` and returns its
    /// length: the bytes [`RoceRepr::emit`] writes for that packet.
    pub fn emit(&self, psn: Psn, aeth: AethRepr, buf: &mut [u8]) -> Result<usize, WireError> {
        let len = usize::from(self.len);
        check_len(buf, len)?;
        let datagram = &mut buf[..len];
        datagram.copy_from_slice(&self.bytes[..len]);
        let at = usize::from(self.psn_at);
        set_u24(datagram, at, psn.value());
        aeth.emit(&mut Aeth::new_unchecked(&mut datagram[at + BTH_LEN - BTH_PSN..]));
        let crc = update(self.crc_before_psn, &datagram[at..at + CHANGING]);
        seal_with(datagram, &self.ip, self.udp.checksum, crc)?;
        Ok(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::opcode::{Operation, Position, ServiceType, Suffix};
    use crate::wire::roce::{Ipv4Repr, Ipv6Repr, UdpChecksum};
    use crate::wire::Opcode;
    use core::net::{Ipv4Addr, Ipv6Addr};
    use proptest::prelude::*;

    fn rc_ack() -> Opcode {
        Opcode::lookup(ServiceType::Rc, Operation::Acknowledge, Position::Only, Suffix::Plain).unwrap()
    }

    fn ip_strategy() -> impl Strategy<Value = IpRepr> {
        prop_oneof![
            (any::<u32>(), any::<u32>(), any::<u8>(), any::<u8>()).prop_map(|(s, d, tos, ttl)| IpRepr::V4(Ipv4Repr {
                tos,
                ttl,
                ..Ipv4Repr::new(Ipv4Addr::from(s), Ipv4Addr::from(d))
            })),
            (any::<u128>(), any::<u128>(), any::<u8>(), 0u32..1 << 20, any::<u8>()).prop_map(
                |(s, d, traffic_class, flow_label, hop_limit)| IpRepr::V6(Ipv6Repr {
                    traffic_class,
                    flow_label,
                    hop_limit,
                    ..Ipv6Repr::new(Ipv6Addr::from(s), Ipv6Addr::from(d))
                })
            ),
        ]
    }

    proptest! {
        /// An ACK from the template is, byte for byte, the datagram the ordinary emitter
        /// builds for the same packet (PKT-ROCE-7, PKT-ROCE-8: its ICRC, and its UDP
        /// checksum where one is sent), with the template reused across PSNs and AETHs.
        #[test]
        fn template_acks_are_the_emitters_bytes(
            ip in ip_strategy(),
            compute in any::<bool>(),
            qpn in 0u32..1 << 24,
            p_key in any::<u16>(),
            dest in 0u32..1 << 24,
            mig_req in any::<bool>(),
            acks in proptest::collection::vec((0u32..1 << 24, any::<u8>(), 0u32..1 << 24), 1..4),
        ) {
            let checksum = if compute { UdpChecksum::Compute } else { UdpChecksum::Zero };
            let udp = UdpRepr::for_qp(qpn, checksum);
            let bth = BthRepr { mig_req, ..BthRepr::new(rc_ack(), p_key, dest, Psn::new(0)) };
            let t = AckTemplate::new(ip, udp, bth).unwrap();
            for (psn, syndrome, msn) in acks {
                let aeth = AethRepr { syndrome: Syndrome::from_byte(syndrome), msn };
                let mut packet = PacketRepr::new(BthRepr { psn: Psn::new(psn), ..bth });
                packet.aeth = Some(aeth);
                let mut want = [0u8; 128];
                let want_len = RoceRepr { ip, udp, packet }.emit(&mut want).unwrap();
                let mut got = [0xa5u8; 128];
                let got_len = t.emit(Psn::new(psn), aeth, &mut got).unwrap();
                prop_assert_eq!(&got[..got_len], &want[..want_len]);
                prop_assert!(icrc::verify_datagram(&got[..got_len]).is_ok());
            }
        }
    }

    /// The template answers for the headers it was built from, whatever the PSN, and for
    /// nothing else.
    #[test]
    fn a_template_is_for_its_own_headers() {
        let ip = IpRepr::V4(Ipv4Repr::new(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2)));
        let udp = UdpRepr::for_qp(17, UdpChecksum::Zero);
        let bth = BthRepr::new(rc_ack(), 0xffff, 18, Psn::new(5));
        let t = AckTemplate::new(ip, udp, bth).unwrap();
        assert!(t.is_for(&ip, &udp, &BthRepr { psn: Psn::new(99), ..bth }));
        assert!(!t.is_for(&ip, &udp, &BthRepr { dest_qp: 19, ..bth }));
        assert!(!t.is_for(&ip, &udp, &BthRepr { mig_req: true, ..bth }));
        assert!(!t.is_for(&ip, &UdpRepr::for_qp(18, UdpChecksum::Zero), &bth));
        let other = IpRepr::V4(Ipv4Repr::new(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 3)));
        assert!(!t.is_for(&other, &udp, &bth));
    }

    /// Only a packet of a BTH and an AETH alone has a template; a short buffer is an error,
    /// not a panic.
    #[test]
    fn other_shapes_and_short_buffers_are_refused() {
        let ip = IpRepr::V4(Ipv4Repr::new(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2)));
        let udp = UdpRepr::for_qp(17, UdpChecksum::Zero);
        let atomic_ack =
            Opcode::lookup(ServiceType::Rc, Operation::AtomicAcknowledge, Position::Only, Suffix::Plain).unwrap();
        let send = Opcode::lookup(ServiceType::Rc, Operation::Send, Position::Only, Suffix::Plain).unwrap();
        for op in [atomic_ack, send] {
            assert!(AckTemplate::new(ip, udp, BthRepr::new(op, 0xffff, 18, Psn::new(0))).is_err());
        }
        let t = AckTemplate::new(ip, udp, BthRepr::new(rc_ack(), 0xffff, 18, Psn::new(0))).unwrap();
        let aeth = AethRepr { syndrome: Syndrome::ACK_NO_CREDITS, msn: 1 };
        assert_eq!(t.emit(Psn::new(1), aeth, &mut [0u8; 47]), Err(WireError::Truncated { needed: 48, len: 47 }));
        assert_eq!(t.emit(Psn::new(1), aeth, &mut [0u8; 48]), Ok(48));
    }
}
