//! Receive-side ICRC verification for datagrams that arrive without their IP header.
//!
//! A UDP socket hands the link the UDP payload (BTH … ICRC) and the two addresses. The ICRC
//! also covers IP and UDP header fields the socket does not report, so the link rebuilds the
//! header ([`emit_ip_udp`]) and checks the ICRC over it:
//!
//! - **IPv6**: every unmasked field (version, payload length, next header, addresses, ports,
//!   UDP length) follows from what the socket reports. Exact.
//! - **IPv4**: Identification (16 bits) and the DF flag are covered by the ICRC and invisible
//!   to a UDP socket. The link first tries a short list of *hypotheses* — Identification 0
//!   with DF (what every unconnected Linux DF socket sends), the index of the segment inside
//!   a GRO buffer (UDP GSO numbers segments 0, 1, 2 …), and the caller's hints (the link
//!   passes the previous Identification from the same source plus one, for senders that
//!   count, softhca's connected flows among them) — each a full 32-bit check of one header. If none matches, it **solves** for the header: CRC-32 is affine over
//!   GF(2) in its input bits for a fixed length, so `icrc(id, df) = icrc(0, DF) ⊕ Σ bitᵢ·eᵢ`
//!   with 17 constant vectors `eᵢ` (one per unknown bit, shifted past the rest of the packet
//!   with zlib's `x^(8n) mod P` trick). Gaussian elimination over GF(2) finds the unknown bits
//!   when a solution exists; the 17 vectors are independent (CRC-32 detects every burst of up
//!   to 32 bits), so it is unique.
//!
//! **Integrity trade-off** of the solved case: the 17 unknown bits use up 17 of the ICRC's 32
//!   check bits, so a randomly corrupted packet passes with probability 2⁻¹⁵ instead of 2⁻³²
//!   (and an attacker who can write the payload can always forge either). Hypothesis matches
//!   keep almost all of the 32 bits (one false accept in 2³² per hypothesis tried, at most 3).
//!   [`IcrcPolicy::Exact`] refuses solved packets for users who want the full check without
//!   privilege; with privilege, the link's raw receive mode sees the real header and checks the
//!   ICRC exactly (see the parent module).

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::wire::icrc::{self, HeadMemo};
use crate::wire::ip::IPV4_HEADER_LEN;
use crate::wire::packet::{Packet, BTH_LEN, ICRC_LEN};
use crate::wire::roce::{emit_ip_udp, IpRepr, Ipv4Repr, Ipv6Repr, UdpChecksum, UdpRepr, ROCE_V2_PORT};
use crate::wire::WireError;

/// Room for the longest IP + UDP header (IPv6).
pub const MAX_IP_UDP: usize = 48;

/// How IPv4 ICRCs are verified without the real header.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum IcrcPolicy {
    /// Hypotheses first, then solve for Identification and DF (the module docs say what that
    /// costs in integrity). Foreign peers such as Linux rxe need this without privilege.
    #[default]
    Solve,
    /// Hypotheses only: the full 32-bit check. A datagram no hypothesis matches is dropped
    /// (counted as bad ICRC); where solving would have accepted it, the Identification solved
    /// for becomes a hypothesis for its source's next datagram ([`Refused::Unproven`]), so a
    /// sender that counts from a random start (a connected Linux socket) loses its first.
    Exact,
}

/// How a datagram's ICRC was verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verified {
    /// Every covered field was known (IPv6, or an IPv4 header from a raw socket).
    Exact,
    /// One of the IPv4 hypotheses matched (full 32-bit check of that header).
    Hypothesis { identification: u16, dont_fragment: bool },
    /// Identification and DF were solved for (weaker check, see the module docs).
    Solved { identification: u16, dont_fragment: bool },
}

/// The header a verified packet travelled under.
#[derive(Debug, Clone, Copy)]
pub struct Rebuilt {
    /// The IP and UDP headers; `bytes[..len]` go in front of the packet.
    pub bytes: [u8; MAX_IP_UDP],
    pub len: usize,
    pub how: Verified,
}

impl Rebuilt {
    pub fn header(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    /// Writes the TOS (Traffic Class) and TTL (Hop Limit) the datagram arrived with, where the
    /// socket reported them, into the rebuilt header: a UD receive shows that header
    /// (PKT-ROCE-11). The ICRC masks both fields, so the check made stands.
    pub fn set_received(&mut self, tos: Option<u8>, ttl: Option<u8>) {
        if tos.is_none() && ttl.is_none() {
            return;
        }
        let b = &mut self.bytes;
        match b[0] >> 4 {
            4 => {
                b[1] = tos.unwrap_or(b[1]);
                b[8] = ttl.unwrap_or(b[8]);
                crate::wire::roce::Ipv4Header::new_unchecked(&mut b[..IPV4_HEADER_LEN]).fill_checksum();
            }
            6 => {
                if let Some(t) = tos {
                    b[0] = 0x60 | (t >> 4);
                    b[1] = (t << 4) | (b[1] & 0x0f);
                }
                b[7] = ttl.unwrap_or(b[7]);
            }
            _ => {}
        }
    }
}

/// Why a datagram was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Too short, or not a transport packet (no BTH and ICRC).
    Malformed,
    /// The addresses are of different families.
    Family,
    /// No header makes the ICRC match.
    BadIcrc,
    /// Under [`IcrcPolicy::Exact`]: no hypothesis matched, but a header solved for would (the
    /// weaker check that policy refuses). The Identification it would have carried: the link
    /// keeps it as a hypothesis for the source's next datagram, which is then checked with all
    /// 32 bits (a connected sender counts from a random start).
    Unproven { identification: u16 },
}

/// Rebuilds the IP + UDP header of `packet` (BTH … ICRC, as a UDP socket delivered it) sent
/// from `src:src_port` to `dst` port 4791, and verifies its ICRC. `hints` are extra IPv4
/// Identifications to try (with DF) after 0.
pub fn rebuild(
    src: IpAddr,
    src_port: u16,
    dst: IpAddr,
    packet: &[u8],
    hints: &[u16],
    policy: IcrcPolicy,
) -> Result<Rebuilt, Refused> {
    rebuild_with(&mut IcrcCache::default(), src, src_port, dst, packet, hints, policy)
}

/// What a link remembers from datagram to datagram to check and stamp ICRCs cheaply (it keeps
/// one per engine).
#[derive(Debug, Clone, Default)]
pub struct IcrcCache {
    /// The Identification bits' effects by packet length: a hypothesis, or a sender's stamp,
    /// costs two lookups, not a CRC pass.
    pub shifts: Shifts,
    /// The CRC over the last two shapes of rebuilt headers (a Send and its ACK from one peer
    /// QP): a short datagram's check is then mostly its own bytes.
    heads: HeadMemo,
}

/// [`rebuild`] with the link's [`IcrcCache`].
pub fn rebuild_with(
    cache: &mut IcrcCache,
    src: IpAddr,
    src_port: u16,
    dst: IpAddr,
    packet: &[u8],
    hints: &[u16],
    policy: IcrcPolicy,
) -> Result<Rebuilt, Refused> {
    let view = Packet::new_checked(packet).map_err(|_| Refused::Malformed)?;
    let received = view.icrc();
    let body = &packet[..view.icrc_offset()];
    let udp = UdpRepr { src_port, dst_port: ROCE_V2_PORT, checksum: UdpChecksum::Zero };
    let mut out = Rebuilt { bytes: [0; MAX_IP_UDP], len: 0, how: Verified::Exact };
    match (src, dst) {
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            out.len = header(&IpRepr::V6(Ipv6Repr::new(s, d)), &udp, packet.len(), &mut out.bytes)?;
            if crc(&mut cache.heads, &out.bytes[..out.len], body)? == received {
                Ok(out)
            } else {
                Err(Refused::BadIcrc)
            }
        }
        (IpAddr::V4(s), IpAddr::V4(d)) => rebuild_v4(cache, s, d, &udp, packet.len(), body, received, hints, policy),
        _ => Err(Refused::Family),
    }
}

/// A small cache, by packet length, of the 17 unknown bits' ICRC effects carried to the end
/// of a packet of that length (the packets of one flow come in very few lengths), with the
/// effect of every value of each Identification byte laid out in a table: then an
/// Identification's effect is two lookups and an XOR (a receiver tries two or three a
/// datagram, a connected sender stamps one on each).
#[derive(Debug, Clone)]
pub struct Shifts {
    slots: [Slot; 4],
    next: usize,
}

#[derive(Debug, Clone)]
struct Slot {
    packet_len: usize,
    effects: [u32; 17],
    /// `by_byte[k][v]`: the effect of Identification byte `k` (0 the low one) being `v`.
    by_byte: [[u32; 256]; 2],
}

impl Default for Shifts {
    fn default() -> Self {
        let empty = Slot { packet_len: 0, effects: [0; 17], by_byte: [[0; 256]; 2] };
        Shifts { slots: [empty.clone(), empty.clone(), empty.clone(), empty], next: 0 }
    }
}

impl Shifts {
    /// The slot for a packet (BTH … ICRC) of `packet_len` bytes, filled on a miss.
    fn slot(&mut self, packet_len: usize) -> &Slot {
        // A filled slot's effects are never 0: the 17 vectors are independent.
        let i = match self.slots.iter().position(|s| s.packet_len == packet_len && s.effects[0] != 0) {
            Some(i) => i,
            None => {
                let shift = x8nmodp(packet_len.saturating_sub(BTH_LEN + ICRC_LEN));
                let i = self.next;
                let s = &mut self.slots[i];
                s.packet_len = packet_len;
                s.effects = id_basis().map(|b| multmodp(shift, b));
                for (k, table) in s.by_byte.iter_mut().enumerate() {
                    // Each value's effect is a smaller value's plus that of its lowest bit.
                    for v in 1..256usize {
                        table[v] = table[v & (v - 1)] ^ s.effects[8 * k + v.trailing_zeros() as usize];
                    }
                }
                self.next = (i + 1) % self.slots.len();
                i
            }
        };
        &self.slots[i]
    }

    /// The effects of the 17 unknown bits (see [`id_basis`]) for a packet (BTH … ICRC) of
    /// `packet_len` bytes, cached.
    fn effects(&mut self, packet_len: usize) -> &[u32; 17] {
        &self.slot(packet_len).effects
    }
}

/// The ICRC difference each of the 17 unknown IPv4 bits makes when it is followed by a BTH
/// and nothing else: bit i < 16 of the Identification (set), bit 16 = DF cleared. The ICRC
/// of equal-length inputs is affine, so these differences do not depend on the addresses,
/// ports or the rest of the header; carrying one past `n` more bytes is `multmodp(x8nmodp(n), d)`.
fn id_basis() -> &'static [u32; 17] {
    static BASIS: std::sync::OnceLock<[u32; 17]> = std::sync::OnceLock::new();
    BASIS.get_or_init(|| {
        let udp = UdpRepr { src_port: 1, dst_port: ROCE_V2_PORT, checksum: UdpChecksum::Zero };
        let (s, d) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
        let bth = [0u8; BTH_LEN];
        let len = BTH_LEN + 4;
        let mut a = [0u8; MAX_IP_UDP];
        let n = emit_ip_udp(&IpRepr::V4(Ipv4Repr::new(s, d)), &udp, len, &mut a).expect("fixed header fits");
        let ca = icrc::compute(&a[..n], &bth).expect("fixed header is valid");
        let mut out = [0u32; 17];
        for (i, o) in out.iter_mut().enumerate() {
            let (id, df) = if i < 16 { (1u16 << i, true) } else { (0, false) };
            let h = IpRepr::V4(Ipv4Repr { identification: id, dont_fragment: df, ..Ipv4Repr::new(s, d) });
            let mut b = [0u8; MAX_IP_UDP];
            emit_ip_udp(&h, &udp, len, &mut b).expect("fixed header fits");
            *o = ca ^ icrc::compute(&b[..n], &bth).expect("fixed header is valid");
        }
        out
    })
}

/// The ICRC difference between IPv4 Identification 0 with DF and (`id`, `df`), for a packet
/// (BTH … ICRC) of `packet_len` bytes.
pub fn id_effect(shifts: &mut Shifts, packet_len: usize, id: u16, df: bool) -> u32 {
    let s = shifts.slot(packet_len);
    // Carrying past the packet is linear, so the carried effects add up (XOR) like the bits.
    let [lo, hi] = id.to_le_bytes();
    let d = s.by_byte[0][usize::from(lo)] ^ s.by_byte[1][usize::from(hi)];
    if df {
        d
    } else {
        d ^ s.effects[16]
    }
}

/// The same for an IPv4-mapped IPv6 address pair as an IPv6 socket reports it.
pub fn unmap(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(a) => a.to_ipv4_mapped().map_or(IpAddr::V6(a), IpAddr::V4),
        a => a,
    }
}

fn header(ip: &IpRepr, udp: &UdpRepr, packet_len: usize, buf: &mut [u8]) -> Result<usize, Refused> {
    emit_ip_udp(ip, udp, packet_len, buf).map_err(|_| Refused::Malformed)
}

fn crc(heads: &mut HeadMemo, ip_udp: &[u8], body: &[u8]) -> Result<u32, Refused> {
    heads.compute(ip_udp, body).map_err(|e: WireError| match e {
        WireError::BadLength | WireError::Truncated { .. } => Refused::Malformed,
        _ => Refused::Malformed,
    })
}

#[allow(clippy::too_many_arguments)]
fn rebuild_v4(
    cache: &mut IcrcCache,
    src: Ipv4Addr,
    dst: Ipv4Addr,
    udp: &UdpRepr,
    packet_len: usize,
    body: &[u8],
    received: u32,
    hints: &[u16],
    policy: IcrcPolicy,
) -> Result<Rebuilt, Refused> {
    let mut out = Rebuilt { bytes: [0; MAX_IP_UDP], len: 0, how: Verified::Exact };
    let mut ip = Ipv4Repr::new(src, dst);
    out.len = header(&IpRepr::V4(ip), udp, packet_len, &mut out.bytes)?;
    let base = crc(&mut cache.heads, &out.bytes[..out.len], body)?;
    let hyp = |id: u16| Verified::Hypothesis { identification: id, dont_fragment: true };
    if base == received {
        out.how = hyp(0);
        return Ok(out);
    }
    if body.len() < BTH_LEN {
        return Err(Refused::Malformed);
    }
    // Each hypothesis differs from the base header only in covered bits, so its ICRC is
    // base ⊕ (the effect of the difference), computed without another pass over the payload.
    let mut effect = |id: u16, df: bool| id_effect(&mut cache.shifts, packet_len, id, df);
    for &id in hints.iter().filter(|&&id| id != 0) {
        if base ^ effect(id, true) == received {
            // The header differs from the base one in its Identification and checksum only.
            let mut h = crate::wire::roce::Ipv4Header::new_unchecked(&mut out.bytes[..IPV4_HEADER_LEN]);
            h.set_identification(id);
            h.fill_checksum();
            out.how = hyp(id);
            return Ok(out);
        }
    }
    // Unknowns: bit i < 16 of the Identification, bit 16 = "DF cleared".
    let mut basis: [(u32, u32); 32] = [(0, 0); 32];
    let effects = *cache.shifts.effects(packet_len);
    for (i, &e) in effects.iter().enumerate() {
        let mut v = e;
        let mut mask = 1u32 << i;
        for bit in (0..32).rev() {
            if v >> bit & 1 == 0 {
                continue;
            }
            if basis[bit].0 == 0 {
                basis[bit] = (v, mask);
                break;
            }
            v ^= basis[bit].0;
            mask ^= basis[bit].1;
        }
    }
    let mut want = base ^ received;
    let mut mask = 0u32;
    for bit in (0..32).rev() {
        if want >> bit & 1 != 0 {
            if basis[bit].0 == 0 {
                return Err(Refused::BadIcrc);
            }
            want ^= basis[bit].0;
            mask ^= basis[bit].1;
        }
    }
    ip.identification = mask as u16;
    ip.dont_fragment = mask & (1 << 16) == 0;
    if policy == IcrcPolicy::Exact {
        return Err(Refused::Unproven { identification: ip.identification });
    }
    out.len = header(&IpRepr::V4(ip), udp, packet_len, &mut out.bytes)?;
    out.how = Verified::Solved { identification: ip.identification, dont_fragment: ip.dont_fragment };
    debug_assert_eq!(icrc::compute(&out.bytes[..out.len], body).ok(), Some(received));
    Ok(out)
}

/// The reflected CRC-32 polynomial.
const POLY: u32 = 0xedb8_8320;

/// `a·b mod P` for polynomials in CRC-32's reflected representation (zlib's `multmodp`).
pub(crate) fn multmodp(a: u32, mut b: u32) -> u32 {
    let mut m = 1u32 << 31;
    let mut p = 0u32;
    loop {
        if a & m != 0 {
            p ^= b;
            if a & (m - 1) == 0 {
                break;
            }
        }
        m >>= 1;
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
        if m == 0 {
            break;
        }
    }
    p
}

/// `x^(8n) mod P`: the operator that carries a CRC difference past `n` more bytes (zlib's
/// `x2nmodp(n, 3)`).
pub(crate) fn x8nmodp(mut n: usize) -> u32 {
    // x^(2^k) for k = 3 upward, squared as needed.
    let mut sq = 1u32 << (31 - 8); // x^8
    let mut p = 1u32 << 31; // x^0
    while n != 0 {
        if n & 1 != 0 {
            p = multmodp(sq, p);
        }
        sq = multmodp(sq, sq);
        n >>= 1;
    }
    p
}

/// Whether two addresses are the same once IPv4-mapped IPv6 is unmapped.
pub fn same_addr(a: IpAddr, b: IpAddr) -> bool {
    unmap(a) == unmap(b)
}

/// The GID of an address: IPv4-mapped IPv6 for IPv4 (PKT-ROCE-3).
pub fn gid_addr(a: IpAddr) -> Ipv6Addr {
    match a {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An Identification's effect from the byte tables is the sum of its bits' effects, for
    /// every length a slot has held (more lengths than slots: slots are reused).
    #[test]
    fn byte_tables_add_up_the_bits() {
        let mut shifts = Shifts::default();
        for packet_len in [20, 24, 28, 64, 1024, 4112, 4128, 9000] {
            let e = *shifts.effects(packet_len);
            for id in [0u16, 1, 0x80, 0x100, 0x1234, 0xa5c3, 0xff00, 0xffff] {
                for df in [true, false] {
                    let bits = (0..16).filter(|i| id >> i & 1 != 0).fold(0, |d, i| d ^ e[i]);
                    let want = if df { bits } else { bits ^ e[16] };
                    assert_eq!(id_effect(&mut shifts, packet_len, id, df), want, "{packet_len} {id:#x} {df}");
                }
            }
        }
    }

    #[test]
    fn shift_matches_crc32_combine() {
        // crc(A || B) = multmodp(x8nmodp(len B), crc(A)) ^ crc(B) for equal-length A, A'.
        let a1 = [1u8, 2, 3, 4, 5, 6, 7, 8];
        let a2 = [1u8, 2, 3, 4, 5, 6, 7, 9];
        let tail = [0x5au8; 1000];
        let full = |a: &[u8]| {
            let mut h = crc32fast::Hasher::new();
            h.update(a);
            h.update(&tail);
            h.finalize()
        };
        let d = crc32fast::hash(&a1) ^ crc32fast::hash(&a2);
        assert_eq!(full(&a1) ^ full(&a2), multmodp(x8nmodp(tail.len()), d));
    }
}
