//! The RoCEv2 Invariant CRC (PKT-ROCE-7, PKT-ROCE-8).
//!
//! The CRC runs over 8 bytes of 0xFF (the absent LRH), the IP and UDP headers
//! with their variant fields masked to all ones, the BTH with byte 4 masked,
//! then the rest of the packet up to the ICRC. Only the headers are copied,
//! into a small stack array, to be masked; the rest continues that CRC in
//! place. Where the payload is being copied anyway (a sender gathering
//! it into a datagram, a link copying a datagram in), the CRC is folded into
//! that copy ([`crate::mem::copy_crc`], [`copy_checked`]): one pass per byte.

use super::bth::{BTH_PSN, BTH_RESV8A};
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
    let hdr_len = ip_header_len(headers)? + UDP_HEADER_LEN;
    check_len(headers, hdr_len + BTH_LEN)?;
    let (ip_udp, packet) = headers.split_at(hdr_len);
    let (prefix, len) = masked_prefix(ip_udp, packet)?;
    Ok(update(0, &prefix[..len - (BTH_LEN - BTH_PSN)]))
}

/// Copies a whole datagram (IP header through ICRC) of `dst.len()` bytes from `src` into
/// `dst`, checking its ICRC on the way: the headers are copied first and the CRC is started
/// over the copy, the rest is copied and checksummed in one pass
/// ([`crate::mem::copy_crc`]). Returns whether the copy's ICRC is right; false also for
/// whatever is too short or malformed to have one (the caller lets the device's own checks
/// say what it is). What was checked is the copy, whatever writes `src` meanwhile.
///
/// # Safety
/// `src` must be valid for `dst.len()` bytes of reads and not overlap `dst`.
pub unsafe fn copy_checked(dst: &mut [u8], src: *const u8) -> bool {
    let len = dst.len();
    let head = len.min(IPV6_HEADER_LEN + UDP_HEADER_LEN + BTH_LEN);
    // SAFETY: `head <= len` bytes of both (the caller's contract).
    unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), head) };
    // The copied head up to the ICRC: its headers, and for IPv4 the first bytes after the BTH.
    let crc = ip_header_len(dst).ok().and_then(|ip_len| {
        let hdr_len = ip_len + UDP_HEADER_LEN;
        let body_end = len.checked_sub(ICRC_LEN).filter(|&e| e >= hdr_len + BTH_LEN)?;
        let (ip_udp, packet) = dst[..head.min(body_end)].split_at(hdr_len);
        Some((compute(ip_udp, packet).ok()?, body_end))
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
    // SAFETY: `from..len` lies inside both ranges.
    unsafe { std::ptr::copy_nonoverlapping(src.add(from), dst.as_mut_ptr().add(from), len - from) };
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
