//! The RoCEv2 Invariant CRC (PKT-ROCE-7, PKT-ROCE-8).
//!
//! The CRC runs over 8 bytes of 0xFF (the absent LRH), the IP and UDP headers
//! with their variant fields masked to all ones, the BTH with byte 4 masked,
//! then the rest of the packet up to the ICRC. Only the headers are copied,
//! into a small stack array, to be masked; the rest continues that CRC in
//! place. Where the payload is being copied anyway (a sender gathering
//! it into a datagram, a link copying a datagram in), the CRC is folded into
//! that copy ([`crate::mem::copy_crc`], [`copy_checked`]): one pass per byte. Where the
//! headers are those of a recent datagram (a QP's next request, a ring's next datagram from
//! the same peer QP), their CRC is remembered rather than computed again ([`HeadMemo`]): for a
//! short packet it is most of the ICRC's cost.

use super::bth::{BTH_ACKREQ, BTH_PSN, BTH_RESV8A};
use super::ip::{ip_header_len, IPV4_HEADER_LEN, IPV6_HEADER_LEN, UDP_HEADER_LEN};
use super::packet::{BTH_LEN, ICRC_LEN};
use super::{check_len, WireError};
use crate::mem::crc32::update;

/// Longest masked prefix: LRH stand-in + IPv6 + UDP + BTH.
const MAX_PREFIX: usize = 8 + IPV6_HEADER_LEN + UDP_HEADER_LEN + BTH_LEN;

/// Computes the ICRC of a transport packet given the IP and UDP headers it
/// travels under.
///
/// - `ip_udp`: the IPv4 (20 bytes, no options) or IPv6 (40 bytes) header
///   followed by the 8-byte UDP header, exactly as sent; the masked fields may
///   hold anything. A receiver whose socket hides the IP header rebuilds it
///   here from what it knows.
/// - `packet`: the BTH through the last pad byte, *without* the ICRC.
pub fn compute(ip_udp: &[u8], packet: &[u8]) -> Result<u32, WireError> {
    let (prefix, len) = masked_prefix(ip_udp, packet)?;
    Ok(update(update(0, &prefix[..len]), &packet[BTH_LEN..]))
}

/// The bytes the ICRC starts with (the LRH stand-in, the IP and UDP headers and the BTH, their
/// variant fields masked to ones) and how many there are.
fn masked_prefix(ip_udp: &[u8], packet: &[u8]) -> Result<([u8; MAX_PREFIX], usize), WireError> {
    let ip_len = ip_header_len(ip_udp)?;
    let hdr_len = ip_len + UDP_HEADER_LEN;
    if ip_udp.len() != hdr_len {
        return Err(WireError::BadLength);
    }
    check_len(packet, BTH_LEN)?;

    let mut prefix = [0xffu8; MAX_PREFIX];
    let ip_at = 8;
    let udp_at = ip_at + ip_len;
    let bth_at = udp_at + UDP_HEADER_LEN;
    let end = bth_at + BTH_LEN;
    prefix[ip_at..bth_at].copy_from_slice(ip_udp);
    prefix[bth_at..end].copy_from_slice(&packet[..BTH_LEN]);

    let ip = &mut prefix[ip_at..udp_at];
    if ip_len == IPV4_HEADER_LEN {
        // TOS, TTL and Header Checksum change hop by hop.
        ip[1] = 0xff;
        ip[8] = 0xff;
        ip[10] = 0xff;
        ip[11] = 0xff;
    } else {
        // Traffic Class (bits 4..12), Flow Label (bits 12..32), Hop Limit.
        ip[0] |= 0x0f;
        ip[1] = 0xff;
        ip[2] = 0xff;
        ip[3] = 0xff;
        ip[7] = 0xff;
    }
    // UDP checksum.
    prefix[udp_at + 6] = 0xff;
    prefix[udp_at + 7] = 0xff;
    // BTH resv8a (FECN/BECN may be set by switches).
    prefix[bth_at + BTH_RESV8A] = 0xff;
    Ok((prefix, end))
}

/// The ICRC's CRC-32 (crc32fast's value) so far of a datagram whose first `headers.len()`
/// bytes (its IP header through its last transport header) are written: what a payload being
/// copied in continues ([`update`], [`crate::mem::copy_crc`]); the value after the last pad
/// byte is the ICRC.
pub fn start_datagram(headers: &[u8]) -> Result<u32, WireError> {
    let hdr_len = ip_header_len(headers)? + UDP_HEADER_LEN;
    check_len(headers, hdr_len + BTH_LEN)?;
    let (ip_udp, packet) = headers.split_at(hdr_len);
    compute(ip_udp, packet)
}

/// The ICRC's CRC-32 so far of a datagram whose headers through the BTH are `headers`, up to
/// and not including the BTH's PSN: what a datagram that differs from it only from the PSN on
/// continues ([`super::ack::AckTemplate`]).
pub fn start_before_psn(headers: &[u8]) -> Result<u32, WireError> {
    start_before(headers, BTH_PSN)
}

/// The ICRC's CRC-32 so far of a datagram whose headers through the BTH are `headers`, up to
/// and not including byte `bth_at` of the BTH.
fn start_before(headers: &[u8], bth_at: usize) -> Result<u32, WireError> {
    let hdr_len = ip_header_len(headers)? + UDP_HEADER_LEN;
    check_len(headers, hdr_len + BTH_LEN)?;
    let (ip_udp, packet) = headers.split_at(hdr_len);
    let (prefix, len) = masked_prefix(ip_udp, packet)?;
    Ok(update(0, &prefix[..len - (BTH_LEN - bth_at)]))
}

/// The bytes a [`HeadMemo`] entry is keyed by, at most: an IPv6 and a UDP header and the BTH
/// up to its AckReq byte.
const MEMO_KEY_MAX: usize = IPV6_HEADER_LEN + UDP_HEADER_LEN + BTH_ACKREQ;

/// The ICRC's CRC over the first headers of the last two shapes of datagram it was shown.
///
/// From one QP to one peer, the datagrams of a stream differ before the BTH's AckReq byte
/// only when their length or opcode does: IP and UDP headers, the BTH's opcode, P_Key and
/// destination QP are the same packet after packet. The CRC over those bytes (with the LRH
/// stand-in, masked as [`compute`] masks them) is most of what a short packet's ICRC costs,
/// so a sender keeps one of these per QP, and a link one per receive ring: a datagram whose
/// leading bytes equal an entry's continues the entry's CRC from its AckReq byte. The entries
/// are keyed by the bytes themselves (the UDP checksum aside, which the ICRC masks and which
/// changes with every packet where it is sent), so a hit gives exactly the CRC [`compute`]
/// would; two entries hold a stream's two shapes (a Send and the ACK that follows it, the
/// middle packets of a Write and its last).
#[derive(Clone, Debug)]
pub struct HeadMemo {
    entries: [MemoEntry; 2],
    /// The entry the next miss replaces.
    next: u8,
}

#[derive(Clone, Copy, Debug)]
struct MemoEntry {
    /// The datagram's first `len` bytes, its UDP checksum zeroed; `len` 0: empty.
    key: [u8; MEMO_KEY_MAX],
    len: u8,
    /// The ICRC's CRC over those bytes (LRH stand-in and masks included).
    crc: u32,
}

impl Default for HeadMemo {
    fn default() -> Self {
        let empty = MemoEntry { key: [0; MEMO_KEY_MAX], len: 0, crc: 0 };
        HeadMemo { entries: [empty; 2], next: 0 }
    }
}

impl HeadMemo {
    /// The ICRC's CRC-32 so far of a datagram whose first bytes (its IP header through at
    /// least its BTH) are `head`: what [`compute`] gives over them, and what a payload being
    /// copied in continues. Fails as [`start_datagram`] fails.
    pub fn start(&mut self, head: &[u8]) -> Result<u32, WireError> {
        let udp_at = ip_header_len(head)?;
        let bth_at = udp_at + UDP_HEADER_LEN;
        check_len(head, bth_at + BTH_LEN)?;
        let len = bth_at + BTH_ACKREQ;
        let sum = udp_at + 6..udp_at + 8; // the UDP checksum
        let key = &head[..len];
        let same = |e: &MemoEntry| {
            usize::from(e.len) == len && e.key[..sum.start] == key[..sum.start] && e.key[sum.end..len] == key[sum.end..]
        };
        let crc = match self.entries.iter().find(|e| same(e)) {
            Some(e) => e.crc,
            None => {
                let crc = start_before(head, BTH_ACKREQ)?;
                let e = &mut self.entries[usize::from(self.next)];
                e.key[..len].copy_from_slice(key);
                e.key[sum].fill(0);
                e.len = len as u8;
                e.crc = crc;
                self.next ^= 1;
                crc
            }
        };
        Ok(update(crc, &head[len..]))
    }

    /// What [`compute`] gives for `packet` (the BTH through the last pad byte, without the
    /// ICRC) under `ip_udp`, the headers of a recent shape taken from the memo: for a receiver
    /// whose IP and UDP headers lie apart from the packet (a UDP socket's, rebuilt).
    pub fn compute(&mut self, ip_udp: &[u8], packet: &[u8]) -> Result<u32, WireError> {
        // The checks and their order are `masked_prefix`'s, so a failure is the same too.
        let n = ip_header_len(ip_udp)? + UDP_HEADER_LEN;
        if ip_udp.len() != n {
            return Err(WireError::BadLength);
        }
        check_len(packet, BTH_LEN)?;
        let mut head = [0u8; IPV6_HEADER_LEN + UDP_HEADER_LEN + BTH_LEN];
        head[..n].copy_from_slice(ip_udp);
        head[n..n + BTH_LEN].copy_from_slice(&packet[..BTH_LEN]);
        Ok(update(self.start(&head[..n + BTH_LEN])?, &packet[BTH_LEN..]))
    }
}

/// Copies a whole datagram (IP header through ICRC) of `dst.len()` bytes from `src` into
/// `dst`, checking its ICRC on the way: the headers are copied first and the CRC is started
/// over the copy, the rest is copied and checksummed in one pass
/// ([`crate::mem::copy_crc`]). Returns whether the copy's ICRC is right; false also for
/// whatever is too short or malformed to have one (the caller lets the device's own checks
/// say what it is). What was checked is the copy, whatever writes `src` meanwhile. The CRC over
/// the first headers comes from `memo` where they are those of a recent datagram.
///
/// # Safety
/// `src` must be valid for `dst.len()` bytes of reads and not overlap `dst`.
#[inline]
pub unsafe fn copy_checked(dst: &mut [u8], src: *const u8, memo: &mut HeadMemo) -> bool {
    let len = dst.len();
    let head = len.min(IPV6_HEADER_LEN + UDP_HEADER_LEN + BTH_LEN);
    // SAFETY: `head <= len` bytes of both (the caller's contract).
    unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), head) };
    // The copied head up to the ICRC: its headers, and for IPv4 the first bytes after the BTH.
    let crc = ip_header_len(dst).ok().and_then(|ip_len| {
        let hdr_len = ip_len + UDP_HEADER_LEN;
        let body_end = len.checked_sub(ICRC_LEN).filter(|&e| e >= hdr_len + BTH_LEN)?;
        Some((memo.start(&dst[..head.min(body_end)]).ok()?, body_end))
    });
    let Some((crc, body_end)) = crc else {
        // Nothing to check: the rest is copied as it is, for the device to judge.
        // SAFETY: the rest of both ranges.
        unsafe { std::ptr::copy_nonoverlapping(src.add(head), dst.as_mut_ptr().add(head), len - head) };
        return false;
    };
    let crc = if body_end > head {
        // SAFETY: `head..body_end` lies inside both ranges.
        unsafe { crate::mem::copy_crc_raw(dst.as_mut_ptr().add(head), src.add(head), body_end - head, crc) }
    } else {
        crc
    };
    let from = head.max(body_end);
    if from < len {
        // SAFETY: `from..len` lies inside both ranges. (A short datagram came whole with the
        // head: no call for nothing.)
        unsafe { std::ptr::copy_nonoverlapping(src.add(from), dst.as_mut_ptr().add(from), len - from) };
    }
    dst[body_end..] == crc.to_le_bytes()
}

/// A datagram cut into `(ip_udp, packet_without_icrc, icrc_bytes)`.
type Parts<'a> = (&'a [u8], &'a [u8], &'a [u8]);

/// Splits a datagram (IP header … ICRC) into its [`Parts`].
fn split(datagram: &[u8]) -> Result<Parts<'_>, WireError> {
    let hdr_len = ip_header_len(datagram)? + UDP_HEADER_LEN;
    check_len(datagram, hdr_len + BTH_LEN + ICRC_LEN)?;
    let (ip_udp, rest) = datagram.split_at(hdr_len);
    let (packet, icrc) = rest.split_at(rest.len() - ICRC_LEN);
    Ok((ip_udp, packet, icrc))
}

/// The ICRC a datagram (IP header through ICRC slot) should carry; the
/// current contents of the slot do not matter.
pub fn compute_datagram(datagram: &[u8]) -> Result<u32, WireError> {
    let (ip_udp, packet, _) = split(datagram)?;
    compute(ip_udp, packet)
}

/// Checks the ICRC at the end of a datagram (PKT-ROCE-10, PKT-VAL-2).
pub fn verify_datagram(datagram: &[u8]) -> Result<(), WireError> {
    let (ip_udp, packet, icrc) = split(datagram)?;
    verify(ip_udp, packet, icrc)
}

/// Checks `icrc` (the 4 bytes as received) against `ip_udp` and `packet`
/// (BTH … pad); see [`compute`].
pub fn verify(ip_udp: &[u8], packet: &[u8], icrc: &[u8]) -> Result<(), WireError> {
    let computed = compute(ip_udp, packet)?;
    let received = match icrc {
        [a, b, c, d] => u32::from_le_bytes([*a, *b, *c, *d]),
        _ => return Err(WireError::BadLength),
    };
    if computed == received {
        Ok(())
    } else {
        Err(WireError::BadIcrc { computed, received })
    }
}

/// XORs `delta` into the ICRC in a datagram's last 4 bytes (least significant byte first,
/// PKT-ROCE-8): a link that changes a field the ICRC covers re-seals by the ICRC's linearity
/// instead of a second pass over the payload. A datagram shorter than an ICRC is left alone.
pub fn xor_trailer(datagram: &mut [u8], delta: u32) {
    let Some(at) = datagram.len().checked_sub(ICRC_LEN) else { return };
    let t = &mut datagram[at..];
    let v = u32::from_le_bytes([t[0], t[1], t[2], t[3]]) ^ delta;
    t.copy_from_slice(&v.to_le_bytes());
}

/// Computes the ICRC of a datagram and writes it into its last 4 bytes, least
/// significant byte first (PKT-ROCE-8).
pub fn fill_datagram(datagram: &mut [u8]) -> Result<u32, WireError> {
    let icrc = compute_datagram(datagram)?;
    let at = datagram.len() - ICRC_LEN;
    datagram[at..].copy_from_slice(&icrc.to_le_bytes());
    Ok(icrc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::bth::BthRepr;
    use crate::wire::packet::PacketRepr;
    use crate::wire::psn::Psn;
    use crate::wire::roce::{IpRepr, Ipv4Repr, Ipv6Repr, RoceRepr, UdpChecksum, UdpRepr};
    use crate::wire::Opcode;
    use core::net::{Ipv4Addr, Ipv6Addr};
    use proptest::prelude::*;

    /// A datagram of one of a few shapes: the picks choose the IP version, the UDP source
    /// port and checksum, the opcode, P_Key and destination QP from two values each, so that
    /// a run of them repeats shapes and changes them.
    fn datagram(shape: u8, psn: u32, ack_req: bool, payload: &[u8]) -> Vec<u8> {
        let pick = |bit: u8| shape & (1 << bit) != 0;
        let ip = if pick(0) {
            IpRepr::V6(Ipv6Repr::new(Ipv6Addr::LOCALHOST, "fe80::2".parse().unwrap()))
        } else {
            IpRepr::V4(Ipv4Repr::new(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2)))
        };
        let checksum = if pick(1) { UdpChecksum::Compute } else { UdpChecksum::Zero };
        let udp = UdpRepr::for_qp(if pick(2) { 17 } else { 18 }, checksum);
        let opcode = if pick(3) { Opcode::RcSendOnly } else { Opcode::RcRdmaWriteMiddle };
        let p_key = if pick(4) { 0xffff } else { 0x8001 };
        let mut bth = BthRepr::new(opcode, p_key, if pick(5) { 0x11 } else { 0x12 }, Psn::new(psn));
        bth.ack_req = ack_req;
        let packet = PacketRepr { payload, ..PacketRepr::new(bth) };
        let repr = RoceRepr { ip, udp, packet };
        let mut d = vec![0u8; repr.buffer_len()];
        repr.emit(&mut d).unwrap();
        d
    }

    proptest! {
        /// Rule PKT-ROCE-7: one memo shown a run of datagrams of repeating and changing shapes
        /// (and every datagram with one of its leading bytes flipped) gives for each the CRC
        /// its headers have from scratch, and its ICRC at the end of the payload; a short or
        /// malformed head fails as `start_datagram` does.
        #[test]
        fn the_memo_gives_the_crc_from_scratch(
            run in proptest::collection::vec(
                (0u8..64, 0u32..1 << 24, any::<bool>(), 0usize..24, 0usize..90), 1..24),
        ) {
            let payload: Vec<u8> = (0..24u8).map(|i| i.wrapping_mul(37)).collect();
            let mut memo = HeadMemo::default();
            for (shape, psn, ack_req, len, flip) in run {
                let d = datagram(shape, psn, ack_req, &payload[..len]);
                let head = d.len() - ICRC_LEN - len - (4 - len % 4) % 4;
                prop_assert_eq!(memo.start(&d[..head]), start_datagram(&d[..head]));
                let body = update(memo.start(&d[..head]).unwrap(), &d[head..d.len() - ICRC_LEN]);
                prop_assert_eq!(&body.to_le_bytes()[..], &d[d.len() - ICRC_LEN..]);
                let mut bad = d.clone();
                bad[flip % head] ^= 0x40;
                prop_assert_eq!(memo.start(&bad[..head]), start_datagram(&bad[..head]));
                prop_assert_eq!(memo.start(&d[..head.min(flip)]), start_datagram(&d[..head.min(flip)]));
                // The same with the IP and UDP headers apart from the packet.
                let hdr = crate::wire::ip::ip_header_len(&d).unwrap() + UDP_HEADER_LEN;
                let (ip_udp, packet) = (&bad[..hdr], &bad[hdr..d.len() - ICRC_LEN]);
                prop_assert_eq!(memo.compute(ip_udp, packet), compute(ip_udp, packet));
                let (ip_udp, packet) = (&d[..hdr], &d[hdr..d.len() - ICRC_LEN]);
                prop_assert_eq!(memo.compute(ip_udp, packet), compute(ip_udp, packet));
                prop_assert_eq!(memo.compute(&ip_udp[..hdr - 1], packet), compute(&ip_udp[..hdr - 1], packet));
            }
        }
    }
}
