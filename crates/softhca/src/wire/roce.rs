//! RoCEv2 encapsulation: IPv4 or IPv6, then UDP to port 4791, then the IBA
//! transport packet ending in the ICRC (PKT-ROCE-1..3), plus Ethernet II
//! framing for pcap taps.
//!
//! Choices made here, all visible on the wire:
//! - **UDP source port**: [`udp_src_port`] maps a QPN into the IANA dynamic
//!   range as `0xC000 | ((qpn ^ (qpn >> 14)) & 0x3fff)`, so one QP is one UDP
//!   flow (PKT-ROCE-6) and QPNs that differ anywhere in their 24 bits tend to
//!   land on different ECMP paths. Receivers accept any source port.
//! - **UDP checksum**: [`UdpChecksum::Zero`] is the IPv4 default (RFC 768
//!   allows it; the ICRC covers the whole packet end to end, and it saves a
//!   second pass over the payload), [`UdpChecksum::Compute`] the IPv6 default
//!   (RFC 8200 makes it mandatory). Both are allowed with both versions, so a
//!   parsed datagram re-emits byte for byte (Linux rxe sends 0 even over
//!   IPv6). Receivers do not check it: the ICRC masks it and protects the same
//!   bytes (PKT-ROCE-7, PKT-ROCE-10).
//! - **IPv4**: 20-byte header, no options; Identification and DF are fields
//!   of [`Ipv4Repr`] (softhca sends Identification 0 with DF set, see
//!   DESIGN.md "Addressing"); the header checksum is computed on emit and
//!   checked on parse. Fragments and options are refused on parse.

use core::net::{Ipv4Addr, Ipv6Addr};
use core::ops::Range;

use super::field::{set_u16, set_u32, u16_at, u32_at};
use super::icrc;
use super::ip::{ip_header_len, IPV4_HEADER_LEN, IPV6_HEADER_LEN, UDP_HEADER_LEN};
use super::opcode::Opcode;
use super::packet::{PacketRepr, ICRC_LEN};
use super::{check_len, WireError};

/// The RoCEv2 UDP destination port.
pub const ROCE_V2_PORT: u16 = 4791;
pub const ETHERNET_HEADER_LEN: usize = 14;
pub const ETHERTYPE_IPV4: u16 = 0x0800;
pub const ETHERTYPE_IPV6: u16 = 0x86dd;
/// 802.1Q VLAN tag and 802.1ad (QinQ) service tag: 4 bytes before the real EtherType.
const ETHERTYPE_VLAN: u16 = 0x8100;
const ETHERTYPE_QINQ: u16 = 0x88A8;
/// IP protocol / next header number of UDP.
pub const IP_PROTO_UDP: u8 = 17;
/// Default TTL / hop limit, as Linux uses.
pub const DEFAULT_HOP_LIMIT: u8 = 64;

/// Locally administered unicast MACs for pcap framing: softhca has no real
/// link layer, and these can never clash with a vendor's address.
pub const MAC_A: [u8; 6] = [0x02, 0x00, 0x00, 0x00, 0x00, 0x01];
pub const MAC_B: [u8; 6] = [0x02, 0x00, 0x00, 0x00, 0x00, 0x02];

/// The UDP source port of a QP's flow (see the module docs).
pub const fn udp_src_port(qpn: u32) -> u16 {
    let qpn = qpn & 0x00ff_ffff;
    0xc000 | ((qpn ^ (qpn >> 14)) & 0x3fff) as u16
}

/// Adds `data` as big-endian 16-bit words to a ones-complement accumulator.
fn ones_sum(data: &[u8], mut acc: u64) -> u64 {
    let mut words = data.chunks_exact(4);
    for w in &mut words {
        acc += u64::from(u32::from_be_bytes([w[0], w[1], w[2], w[3]]));
    }
    let rest = words.remainder();
    let mut tail = [0u8; 4];
    tail[..rest.len()].copy_from_slice(rest);
    acc + u64::from(u32::from_be_bytes(tail))
}

/// Folds a ones-complement accumulator to 16 bits.
fn fold(mut acc: u64) -> u16 {
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// Field offsets of the IPv4 header (no options), named once.
mod ipv4_field {
    pub const VERSION_IHL: usize = 0;
    pub const TOS: usize = 1;
    pub const TOTAL_LEN: usize = 2;
    pub const IDENT: usize = 4;
    pub const FLAGS_FRAG: usize = 6;
    pub const TTL: usize = 8;
    pub const PROTOCOL: usize = 9;
    pub const CHECKSUM: usize = 10;
    pub const SRC: usize = 12;
    pub const DST: usize = 16;
}

/// Field offsets of the IPv6 header, named once.
mod ipv6_field {
    pub const PAYLOAD_LEN: usize = 4;
    pub const NEXT_HEADER: usize = 6;
    pub const HOP_LIMIT: usize = 7;
    pub const SRC: usize = 8;
    pub const DST: usize = 24;
}

/// Field offsets of the UDP header, named once.
mod udp_field {
    pub const SRC_PORT: usize = 0;
    pub const DST_PORT: usize = 2;
    pub const LEN: usize = 4;
    pub const CHECKSUM: usize = 6;
}

/// The Flags/Fragment Offset word of a datagram that may not be fragmented.
pub const IPV4_DONT_FRAGMENT: u16 = 0x4000;

super::header_view!(
    /// A view over an IPv4 header (20 bytes, no options), read and written in place: what a
    /// link that stamps datagrams after the core built them uses (Identification, lengths,
    /// the header checksum).
    Ipv4Header, IPV4_HEADER_LEN
);

impl<T: AsRef<[u8]>> Ipv4Header<T> {
    /// Version 4 with a 20-byte header (no options), the only IPv4 header RoCEv2 uses.
    pub fn is_plain_v4(&self) -> bool {
        self.buffer.as_ref()[ipv4_field::VERSION_IHL] == 0x45
    }
    pub fn total_len(&self) -> u16 {
        u16_at(self.buffer.as_ref(), ipv4_field::TOTAL_LEN)
    }
    pub fn identification(&self) -> u16 {
        u16_at(self.buffer.as_ref(), ipv4_field::IDENT)
    }
    /// Flags (DF, MF) and Fragment Offset.
    pub fn flags_fragment(&self) -> u16 {
        u16_at(self.buffer.as_ref(), ipv4_field::FLAGS_FRAG)
    }
    pub fn src_addr(&self) -> Ipv4Addr {
        let b = self.buffer.as_ref();
        Ipv4Addr::new(b[ipv4_field::SRC], b[ipv4_field::SRC + 1], b[ipv4_field::SRC + 2], b[ipv4_field::SRC + 3])
    }
    pub fn dst_addr(&self) -> Ipv4Addr {
        let b = self.buffer.as_ref();
        Ipv4Addr::new(b[ipv4_field::DST], b[ipv4_field::DST + 1], b[ipv4_field::DST + 2], b[ipv4_field::DST + 3])
    }
    /// Whether the header checksum is right.
    pub fn checksum_ok(&self) -> bool {
        fold(ones_sum(&self.buffer.as_ref()[..IPV4_HEADER_LEN], 0)) == 0xffff
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv4Header<T> {
    pub fn set_total_len(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), ipv4_field::TOTAL_LEN, v);
    }
    pub fn set_identification(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), ipv4_field::IDENT, v);
    }
    pub fn set_flags_fragment(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), ipv4_field::FLAGS_FRAG, v);
    }
    /// Recomputes the header checksum over the other fields.
    pub fn fill_checksum(&mut self) {
        let h = &mut self.buffer.as_mut()[..IPV4_HEADER_LEN];
        set_u16(h, ipv4_field::CHECKSUM, 0);
        let sum = !fold(ones_sum(h, 0));
        set_u16(h, ipv4_field::CHECKSUM, sum);
    }
}

super::header_view!(
    /// A view over an IPv6 header (40 bytes).
    Ipv6Header, IPV6_HEADER_LEN
);

impl<T: AsRef<[u8]>> Ipv6Header<T> {
    fn addr_at(&self, at: usize) -> Ipv6Addr {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.buffer.as_ref()[at..at + 16]);
        a.into()
    }
    pub fn src_addr(&self) -> Ipv6Addr {
        self.addr_at(ipv6_field::SRC)
    }
    pub fn dst_addr(&self) -> Ipv6Addr {
        self.addr_at(ipv6_field::DST)
    }
}

super::header_view!(
    /// A view over a UDP header (8 bytes).
    UdpHeader, UDP_HEADER_LEN
);

impl<T: AsRef<[u8]>> UdpHeader<T> {
    pub fn src_port(&self) -> u16 {
        u16_at(self.buffer.as_ref(), udp_field::SRC_PORT)
    }
    pub fn dst_port(&self) -> u16 {
        u16_at(self.buffer.as_ref(), udp_field::DST_PORT)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> UdpHeader<T> {
    pub fn set_len(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), udp_field::LEN, v);
    }
}

/// An outbound or parsed IPv4 header (20 bytes, no options).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Repr {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    /// The TOS byte (DSCP and ECN), from the AV's Traffic Class (PKT-ROCE-3).
    pub tos: u8,
    pub identification: u16,
    /// Don't Fragment.
    pub dont_fragment: bool,
    /// From the AV's Hop Limit (PKT-ROCE-3).
    pub ttl: u8,
}

impl Ipv4Repr {
    /// What softhca sends: Identification 0, DF set, TTL 64.
    pub const fn new(src: Ipv4Addr, dst: Ipv4Addr) -> Self {
        Ipv4Repr { src, dst, tos: 0, identification: 0, dont_fragment: true, ttl: DEFAULT_HOP_LIMIT }
    }

    /// Parses the header at the start of `buf` and returns it with the IP
    /// payload (up to Total Length; link-layer padding after it is dropped).
    pub fn parse(buf: &[u8]) -> Result<(Self, &[u8]), WireError> {
        check_len(buf, IPV4_HEADER_LEN)?;
        if ip_header_len(buf)? != IPV4_HEADER_LEN {
            return Err(WireError::BadIpVersion(buf[0] >> 4));
        }
        let h = &buf[..IPV4_HEADER_LEN];
        if !Ipv4Header::new_unchecked(h).checksum_ok() {
            return Err(WireError::BadIpChecksum);
        }
        let total = usize::from(u16_at(h, ipv4_field::TOTAL_LEN));
        if total < IPV4_HEADER_LEN || total > buf.len() {
            return Err(WireError::BadLength);
        }
        let flags_frag = u16_at(h, ipv4_field::FLAGS_FRAG);
        if flags_frag & 0x3fff != 0 {
            return Err(WireError::UnsupportedIp("IPv4 fragment"));
        }
        if h[ipv4_field::PROTOCOL] != IP_PROTO_UDP {
            return Err(WireError::NotUdp(h[ipv4_field::PROTOCOL]));
        }
        let repr = Ipv4Repr {
            src: Ipv4Header::new_unchecked(h).src_addr(),
            dst: Ipv4Header::new_unchecked(h).dst_addr(),
            tos: h[ipv4_field::TOS],
            identification: u16_at(h, ipv4_field::IDENT),
            dont_fragment: flags_frag & IPV4_DONT_FRAGMENT != 0,
            ttl: h[ipv4_field::TTL],
        };
        Ok((repr, &buf[IPV4_HEADER_LEN..total]))
    }

    /// Writes the header for `payload_len` bytes of UDP datagram, checksum
    /// included (PKT-ROCE-2).
    pub fn emit(&self, payload_len: usize, buf: &mut [u8]) -> Result<(), WireError> {
        check_len(buf, IPV4_HEADER_LEN)?;
        let total = u16::try_from(IPV4_HEADER_LEN + payload_len).map_err(|_| WireError::BadLength)?;
        let h = &mut buf[..IPV4_HEADER_LEN];
        h[0] = 0x45;
        h[ipv4_field::TOS] = self.tos;
        set_u16(h, ipv4_field::TOTAL_LEN, total);
        set_u16(h, ipv4_field::IDENT, self.identification);
        set_u16(h, ipv4_field::FLAGS_FRAG, if self.dont_fragment { IPV4_DONT_FRAGMENT } else { 0 });
        h[ipv4_field::TTL] = self.ttl;
        h[ipv4_field::PROTOCOL] = IP_PROTO_UDP;
        h[ipv4_field::SRC..ipv4_field::SRC + 4].copy_from_slice(&self.src.octets());
        h[ipv4_field::DST..ipv4_field::DST + 4].copy_from_slice(&self.dst.octets());
        Ipv4Header::new_unchecked(h).fill_checksum();
        Ok(())
    }
}

/// An outbound or parsed IPv6 header (40 bytes, Next Header = UDP).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv6Repr {
    pub src: Ipv6Addr,
    pub dst: Ipv6Addr,
    /// From the AV's Traffic Class (PKT-ROCE-3).
    pub traffic_class: u8,
    /// 20 bits, from the AV's Flow Label (PKT-ROCE-3).
    pub flow_label: u32,
    /// From the AV's Hop Limit (PKT-ROCE-3).
    pub hop_limit: u8,
}

impl Ipv6Repr {
    pub const fn new(src: Ipv6Addr, dst: Ipv6Addr) -> Self {
        Ipv6Repr { src, dst, traffic_class: 0, flow_label: 0, hop_limit: DEFAULT_HOP_LIMIT }
    }

    /// Parses the header at the start of `buf` and returns it with the IP
    /// payload (Payload Length bytes).
    pub fn parse(buf: &[u8]) -> Result<(Self, &[u8]), WireError> {
        check_len(buf, IPV6_HEADER_LEN)?;
        let h = &buf[..IPV6_HEADER_LEN];
        if h[0] >> 4 != 6 {
            return Err(WireError::BadIpVersion(h[0] >> 4));
        }
        if h[ipv6_field::NEXT_HEADER] != IP_PROTO_UDP {
            return Err(WireError::NotUdp(h[ipv6_field::NEXT_HEADER]));
        }
        let end = IPV6_HEADER_LEN + usize::from(u16_at(h, ipv6_field::PAYLOAD_LEN));
        let payload = buf.get(IPV6_HEADER_LEN..end).ok_or(WireError::Truncated { needed: end, len: buf.len() })?;
        let word0 = u32_at(h, 0);
        let mut src = [0u8; 16];
        let mut dst = [0u8; 16];
        src.copy_from_slice(&h[ipv6_field::SRC..ipv6_field::SRC + 16]);
        dst.copy_from_slice(&h[ipv6_field::DST..ipv6_field::DST + 16]);
        let repr = Ipv6Repr {
            src: Ipv6Addr::from(src),
            dst: Ipv6Addr::from(dst),
            traffic_class: (word0 >> 20) as u8,
            flow_label: word0 & 0x000f_ffff,
            hop_limit: h[ipv6_field::HOP_LIMIT],
        };
        Ok((repr, payload))
    }

    /// Writes the header for `payload_len` bytes of UDP datagram (PKT-ROCE-2).
    pub fn emit(&self, payload_len: usize, buf: &mut [u8]) -> Result<(), WireError> {
        check_len(buf, IPV6_HEADER_LEN)?;
        let plen = u16::try_from(payload_len).map_err(|_| WireError::BadLength)?;
        let h = &mut buf[..IPV6_HEADER_LEN];
        set_u32(h, 0, (6 << 28) | (u32::from(self.traffic_class) << 20) | (self.flow_label & 0x000f_ffff));
        set_u16(h, ipv6_field::PAYLOAD_LEN, plen);
        h[ipv6_field::NEXT_HEADER] = IP_PROTO_UDP;
        h[ipv6_field::HOP_LIMIT] = self.hop_limit;
        h[ipv6_field::SRC..ipv6_field::SRC + 16].copy_from_slice(&self.src.octets());
        h[ipv6_field::DST..ipv6_field::DST + 16].copy_from_slice(&self.dst.octets());
        Ok(())
    }
}

/// The network header of a RoCEv2 packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpRepr {
    V4(Ipv4Repr),
    V6(Ipv6Repr),
}

impl IpRepr {
    pub const fn header_len(&self) -> usize {
        match self {
            IpRepr::V4(_) => IPV4_HEADER_LEN,
            IpRepr::V6(_) => IPV6_HEADER_LEN,
        }
    }

    /// Parses an IPv4 or IPv6 header carrying UDP; returns it with the IP
    /// payload.
    pub fn parse(buf: &[u8]) -> Result<(Self, &[u8]), WireError> {
        match ip_header_len(buf)? {
            IPV4_HEADER_LEN => Ipv4Repr::parse(buf).map(|(r, p)| (IpRepr::V4(r), p)),
            _ => Ipv6Repr::parse(buf).map(|(r, p)| (IpRepr::V6(r), p)),
        }
    }

    pub fn emit(&self, payload_len: usize, buf: &mut [u8]) -> Result<(), WireError> {
        match self {
            IpRepr::V4(r) => r.emit(payload_len, buf),
            IpRepr::V6(r) => r.emit(payload_len, buf),
        }
    }

    /// Source address as a GID: IPv4 addresses as IPv4-mapped IPv6
    /// (PKT-ROCE-3).
    pub fn src_gid(&self) -> Ipv6Addr {
        match self {
            IpRepr::V4(r) => r.src.to_ipv6_mapped(),
            IpRepr::V6(r) => r.src,
        }
    }

    /// Destination address as a GID (see [`src_gid`](Self::src_gid)).
    pub fn dst_gid(&self) -> Ipv6Addr {
        match self {
            IpRepr::V4(r) => r.dst.to_ipv6_mapped(),
            IpRepr::V6(r) => r.dst,
        }
    }

    /// Whether the destination is a multicast address (IPv4 224.0.0.0/4, IPv6 ff00::/8): a
    /// multicast GID (IBA 10.5), tested on the header as it is.
    pub fn dst_is_multicast(&self) -> bool {
        match self {
            IpRepr::V4(r) => r.dst.is_multicast(),
            IpRepr::V6(r) => r.dst.octets()[0] == 0xFF,
        }
    }

    /// The ones-complement sum of the UDP pseudo-header.
    fn pseudo_header_sum(&self, udp_len: usize) -> u64 {
        match self {
            IpRepr::V4(r) => {
                let acc = ones_sum(&r.src.octets(), 0);
                let acc = ones_sum(&r.dst.octets(), acc);
                acc + u64::from(IP_PROTO_UDP) + udp_len as u64
            }
            IpRepr::V6(r) => {
                let acc = ones_sum(&r.src.octets(), 0);
                let acc = ones_sum(&r.dst.octets(), acc);
                acc + u64::from(IP_PROTO_UDP) + udp_len as u64
            }
        }
    }
}

/// Whether a sender fills in the UDP checksum (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UdpChecksum {
    /// Send 0 ("no checksum").
    Zero,
    /// Compute it over the pseudo-header and the whole UDP payload.
    Compute,
}

impl UdpChecksum {
    /// The default for an IP version: `Zero` for IPv4, `Compute` for IPv6.
    pub const fn default_for(ip: &IpRepr) -> Self {
        match ip {
            IpRepr::V4(_) => UdpChecksum::Zero,
            IpRepr::V6(_) => UdpChecksum::Compute,
        }
    }
}

/// A UDP header. Length and checksum are derived on emit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpRepr {
    pub src_port: u16,
    /// 4791 for RoCEv2 (PKT-ROCE-1).
    pub dst_port: u16,
    pub checksum: UdpChecksum,
}

impl UdpRepr {
    /// The header a QP sends with (PKT-ROCE-6).
    pub const fn for_qp(qpn: u32, checksum: UdpChecksum) -> Self {
        UdpRepr { src_port: udp_src_port(qpn), dst_port: ROCE_V2_PORT, checksum }
    }

    /// Parses a UDP header whose length must equal the IP payload length;
    /// returns it with the UDP payload.
    pub fn parse(ip_payload: &[u8]) -> Result<(Self, &[u8]), WireError> {
        check_len(ip_payload, UDP_HEADER_LEN)?;
        let len = usize::from(u16_at(ip_payload, udp_field::LEN));
        if len != ip_payload.len() {
            return Err(WireError::BadLength);
        }
        let repr = UdpRepr {
            src_port: u16_at(ip_payload, udp_field::SRC_PORT),
            dst_port: u16_at(ip_payload, udp_field::DST_PORT),
            checksum: if u16_at(ip_payload, udp_field::CHECKSUM) == 0 {
                UdpChecksum::Zero
            } else {
                UdpChecksum::Compute
            },
        };
        Ok((repr, &ip_payload[UDP_HEADER_LEN..]))
    }

    /// Writes the header with checksum 0; [`seal`] computes it when asked.
    pub fn emit(&self, payload_len: usize, buf: &mut [u8]) -> Result<(), WireError> {
        check_len(buf, UDP_HEADER_LEN)?;
        let len = u16::try_from(UDP_HEADER_LEN + payload_len).map_err(|_| WireError::BadLength)?;
        set_u16(buf, udp_field::SRC_PORT, self.src_port);
        set_u16(buf, udp_field::DST_PORT, self.dst_port);
        set_u16(buf, udp_field::LEN, len);
        set_u16(buf, udp_field::CHECKSUM, 0);
        Ok(())
    }
}

/// Writes the IP and UDP headers for a transport packet of `packet_len`
/// bytes (BTH … ICRC) and returns their length (28 or 48), UDP checksum 0.
/// A receiver whose socket does not show it the IP header rebuilds it with
/// this to check the ICRC ([`icrc::compute`]).
pub fn emit_ip_udp(ip: &IpRepr, udp: &UdpRepr, packet_len: usize, buf: &mut [u8]) -> Result<usize, WireError> {
    let hdr = ip.header_len() + UDP_HEADER_LEN;
    check_len(buf, hdr)?;
    ip.emit(UDP_HEADER_LEN + packet_len, buf)?;
    udp.emit(packet_len, &mut buf[ip.header_len()..])?;
    Ok(hdr)
}

/// Finishes a datagram whose headers and payload are in place: computes the
/// ICRC into its last 4 bytes, then the UDP checksum if `checksum` asks for
/// it (in that order, since the checksum covers the ICRC and the ICRC masks
/// the checksum).
pub fn seal(datagram: &mut [u8], ip: &IpRepr, checksum: UdpChecksum) -> Result<(), WireError> {
    let icrc = icrc::compute_datagram(datagram)?;
    seal_with(datagram, ip, checksum, icrc)
}

/// [`seal`] with the ICRC already known: computed while the datagram was written
/// ([`icrc::start_datagram`] over its headers, continued over the payload as it was copied
/// in and over the pad), so that no second pass reads the payload back.
pub fn seal_with(datagram: &mut [u8], ip: &IpRepr, checksum: UdpChecksum, icrc: u32) -> Result<(), WireError> {
    let at = datagram.len().checked_sub(ICRC_LEN).ok_or(WireError::BadLength)?;
    datagram[at..].copy_from_slice(&icrc.to_le_bytes());
    if checksum == UdpChecksum::Compute {
        let at = ip.header_len();
        let udp = datagram.get_mut(at..).ok_or(WireError::BadLength)?;
        check_len(udp, UDP_HEADER_LEN)?;
        set_u16(udp, udp_field::CHECKSUM, 0);
        let sum = !fold(ones_sum(udp, ip.pseudo_header_sum(udp.len())));
        // 0 means "no checksum", so a computed 0 is sent as its other form.
        set_u16(udp, udp_field::CHECKSUM, if sum == 0 { 0xffff } else { sum });
    }
    Ok(())
}

/// A whole RoCEv2 datagram: IP header, UDP header and transport packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoceRepr<'a> {
    pub ip: IpRepr,
    pub udp: UdpRepr,
    pub packet: PacketRepr<'a>,
}

impl RoceRepr<'_> {
    /// Bytes from the IP header through the ICRC.
    pub fn buffer_len(&self) -> usize {
        self.ip.header_len() + UDP_HEADER_LEN + self.packet.buffer_len()
    }

    /// Builds the whole datagram into the start of `buf`, ICRC and checksums
    /// included, and returns its length. Allocates nothing.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let range = self.emit_headers(self.packet.payload.len(), buf)?;
        let len = range.end + crate::wire::packet::pad_for(range.len()) + ICRC_LEN;
        buf[range].copy_from_slice(self.packet.payload);
        seal(&mut buf[..len], &self.ip, self.udp.checksum)?;
        Ok(len)
    }

    /// Writes every header for a payload of `payload_len` bytes and returns
    /// where the payload goes; the caller writes it and then calls [`seal`] on
    /// `buf[..self.buffer_len()]` (with the payload length that was used).
    pub fn emit_headers(&self, payload_len: usize, buf: &mut [u8]) -> Result<Range<usize>, WireError> {
        let packet_len = self.packet.header_len() + payload_len + crate::wire::packet::pad_for(payload_len) + ICRC_LEN;
        let hdr = emit_ip_udp(&self.ip, &self.udp, packet_len, buf)?;
        let range = self.packet.emit_headers(payload_len, &mut buf[hdr..])?;
        Ok(range.start + hdr..range.end + hdr)
    }

    /// Builds an Ethernet II frame around the datagram (for pcap taps) and
    /// returns its length.
    pub fn emit_ethernet(&self, src_mac: [u8; 6], dst_mac: [u8; 6], buf: &mut [u8]) -> Result<usize, WireError> {
        check_len(buf, ETHERNET_HEADER_LEN)?;
        let ethertype = match self.ip {
            IpRepr::V4(_) => ETHERTYPE_IPV4,
            IpRepr::V6(_) => ETHERTYPE_IPV6,
        };
        EthernetRepr { dst: dst_mac, src: src_mac, ethertype }.emit(buf)?;
        Ok(ETHERNET_HEADER_LEN + self.emit(&mut buf[ETHERNET_HEADER_LEN..])?)
    }
}

/// A parsed inbound RoCEv2 datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoceDatagram<'a> {
    pub ip: IpRepr,
    pub udp: UdpRepr,
    pub packet: PacketRepr<'a>,
    /// The received ICRC (already verified by [`parse_ip`]).
    pub icrc: u32,
}

impl<'a> RoceDatagram<'a> {
    /// The same datagram as a repr to emit (e.g. to re-emit a parsed packet).
    pub fn to_repr(&self) -> RoceRepr<'a> {
        RoceRepr { ip: self.ip, udp: self.udp, packet: self.packet }
    }
}

/// The pieces of an IP datagram carrying RoCEv2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoceSplit<'a> {
    pub ip: IpRepr,
    pub udp: UdpRepr,
    /// The IP and UDP headers as received, for the ICRC.
    pub ip_udp: &'a [u8],
    /// BTH through ICRC.
    pub packet: &'a [u8],
}

/// An IPv6 datagram that is not RoCEv2 (not UDP to port 4791): a Raw IPv6 packet (IBA's Raw
/// IPv6 datagram service), for the Raw IPv6 QPs. Its destination is [`raw_ipv6_dst`].
pub fn is_raw_ipv6(datagram: &[u8]) -> bool {
    let v6 = datagram.len() >= IPV6_HEADER_LEN && datagram[0] >> 4 == 6;
    let roce = datagram.get(ipv6_field::NEXT_HEADER) == Some(&17)
        && datagram.get(IPV6_HEADER_LEN + udp_field::DST_PORT..IPV6_HEADER_LEN + udp_field::DST_PORT + 2)
            == Some(&ROCE_V2_PORT.to_be_bytes()[..]);
    v6 && !roce
}

/// The destination address of a Raw IPv6 packet (see [`is_raw_ipv6`]).
pub fn raw_ipv6_dst(datagram: &[u8]) -> Option<Ipv6Addr> {
    is_raw_ipv6(datagram).then(|| Ipv6Header::new_unchecked(datagram).dst_addr())
}

/// Parses the IP and UDP headers of `datagram` and checks that it is RoCEv2
/// (UDP to port 4791); nothing after the UDP header is looked at.
pub fn split_ip(datagram: &[u8]) -> Result<RoceSplit<'_>, WireError> {
    let (ip, ip_payload) = IpRepr::parse(datagram)?;
    let (udp, packet) = UdpRepr::parse(ip_payload)?;
    if udp.dst_port != ROCE_V2_PORT {
        return Err(WireError::NotRoce(udp.dst_port));
    }
    let hdr = ip.header_len() + UDP_HEADER_LEN;
    Ok(RoceSplit { ip, udp, ip_udp: &datagram[..hdr], packet })
}

/// Inlined, with [`PacketRepr::parse`], into the receive paths' two callers: the datagram is
/// built where they return it, not built in a temporary and moved there (some 200 bytes, a
/// dozen vector loads and stores a datagram, each costly under qemu's TCG).
#[inline(always)]
fn parse_split(split: RoceSplit<'_>, verify: bool) -> Result<RoceDatagram<'_>, WireError> {
    let packet = crate::wire::packet::Packet::new_checked(split.packet)?;
    let icrc = packet.icrc();
    if verify {
        let body = &split.packet[..packet.icrc_offset()];
        let computed = icrc::compute(split.ip_udp, body)?;
        if computed != icrc {
            return Err(WireError::BadIcrc { computed, received: icrc });
        }
    }
    Ok(RoceDatagram { ip: split.ip, udp: split.udp, packet: PacketRepr::parse(&packet)?, icrc })
}

/// The destination QP of an inbound datagram (from the IP header on), read without parsing
/// or checking anything else: for a link that looks one datagram ahead to warm the QP it is
/// for (`Engine::prefetch_dest`). `None` when the datagram is too short to say.
pub fn peek_dest_qp(datagram: &[u8]) -> Option<u32> {
    Some(crate::wire::bth::Bth::new_checked(peek_bth(datagram)?).ok()?.dest_qp())
}

/// The BTH opcode of an inbound datagram (from the IP header on), read like
/// [`peek_dest_qp`]: for a link deciding whether to deliver the next datagram in this turn.
pub fn peek_opcode(datagram: &[u8]) -> Option<Opcode> {
    peek_bth(datagram)?.first().map(|&op| Opcode::from(op))
}

/// What follows the IP and UDP headers of an inbound datagram: its BTH on, unchecked.
fn peek_bth(datagram: &[u8]) -> Option<&[u8]> {
    datagram.get(ip_header_len(datagram).ok()? + UDP_HEADER_LEN..)
}

/// Parses an inbound IP datagram (from the IP header on) and verifies its
/// ICRC (PKT-ROCE-10): the receive path of a link that sees IP headers.
pub fn parse_ip(datagram: &[u8]) -> Result<RoceDatagram<'_>, WireError> {
    parse_split(split_ip(datagram)?, true)
}

/// [`parse_ip`] without the ICRC check, for tools that show broken packets.
pub fn parse_ip_unverified(datagram: &[u8]) -> Result<RoceDatagram<'_>, WireError> {
    parse_split(split_ip(datagram)?, false)
}

/// Parses a transport packet (BTH … ICRC) that arrived without its IP
/// header, e.g. as a UDP socket's payload, and verifies its ICRC over
/// `ip_udp`: the IP and UDP headers the receiver rebuilt with [`emit_ip_udp`]
/// from what the socket reported (PKT-ROCE-10).
pub fn parse_transport<'a>(ip_udp: &[u8], packet: &'a [u8]) -> Result<PacketRepr<'a>, WireError> {
    let view = crate::wire::packet::Packet::new_checked(packet)?;
    let received = view.icrc();
    let computed = icrc::compute(ip_udp, &packet[..view.icrc_offset()])?;
    if computed != received {
        return Err(WireError::BadIcrc { computed, received });
    }
    PacketRepr::parse(&view)
}

/// An Ethernet II header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EthernetRepr {
    pub dst: [u8; 6],
    pub src: [u8; 6],
    pub ethertype: u16,
}

impl EthernetRepr {
    /// Parses the header and returns it with the frame's payload, which
    /// must be IPv4 or IPv6. 802.1Q / 802.1ad tags are skipped: RoCE
    /// traffic is usually VLAN-tagged (for PFC).
    pub fn parse(frame: &[u8]) -> Result<(Self, &[u8]), WireError> {
        check_len(frame, ETHERNET_HEADER_LEN)?;
        let mut dst = [0u8; 6];
        let mut src = [0u8; 6];
        dst.copy_from_slice(&frame[0..6]);
        src.copy_from_slice(&frame[6..12]);
        let mut at = 12;
        let mut ethertype = u16_at(frame, at);
        while matches!(ethertype, ETHERTYPE_VLAN | ETHERTYPE_QINQ) {
            at += 4;
            check_len(frame, at + 2)?;
            ethertype = u16_at(frame, at);
        }
        if ethertype != ETHERTYPE_IPV4 && ethertype != ETHERTYPE_IPV6 {
            return Err(WireError::BadEtherType(ethertype));
        }
        Ok((EthernetRepr { dst, src, ethertype }, &frame[at + 2..]))
    }

    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        check_len(buf, ETHERNET_HEADER_LEN)?;
        buf[0..6].copy_from_slice(&self.dst);
        buf[6..12].copy_from_slice(&self.src);
        set_u16(buf, 12, self.ethertype);
        Ok(())
    }
}

/// Parses an Ethernet frame carrying a RoCEv2 datagram and verifies its ICRC.
/// Trailing link padding after the IP datagram is ignored.
pub fn parse_ethernet(frame: &[u8]) -> Result<(EthernetRepr, RoceDatagram<'_>), WireError> {
    let (eth, ip) = EthernetRepr::parse(frame)?;
    Ok((eth, parse_ip(ip)?))
}

/// The IP datagram inside an Ethernet frame, cut at the IP length (so link
/// padding is dropped), for callers that want the raw bytes.
pub fn ip_datagram_of_frame(frame: &[u8]) -> Result<&[u8], WireError> {
    let (_, ip) = EthernetRepr::parse(frame)?;
    let split = split_ip(ip)?;
    let len = split.ip.header_len() + UDP_HEADER_LEN + split.packet.len();
    ip.get(..len).ok_or(WireError::BadLength)
}

/// The 40 bytes a UD receive places in the GRH area of the receive buffer
/// (PKT-ROCE-11): an IPv6 packet's IPv6 header, or for IPv4 20 bytes the spec
/// leaves undefined (written as 0, so nothing stale leaks to the consumer)
/// followed by the IPv4 header. `datagram` starts at the IP header.
pub fn ud_grh(datagram: &[u8]) -> Result<[u8; 40], WireError> {
    let len = ip_header_len(datagram)?;
    check_len(datagram, len)?;
    let mut grh = [0u8; IPV6_HEADER_LEN];
    grh[IPV6_HEADER_LEN - len..].copy_from_slice(&datagram[..len]);
    Ok(grh)
}

/// Whether a GRH area [`ud_grh`] wrote holds an IPv6 header (from byte 0) rather than an
/// IPv4 one (from byte 20, the bytes before it zero).
pub fn ud_grh_is_ipv6(grh: &[u8; 40]) -> bool {
    grh[0] >> 4 == 6
}
