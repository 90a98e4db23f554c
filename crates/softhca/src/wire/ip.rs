//! The IP and UDP header lengths a RoCEv2 datagram is framed by, and the IP header length of a
//! datagram in hand. Both the encapsulation ([`super::roce`]) and the ICRC ([`super::icrc`],
//! which masks fields at fixed offsets of these headers) read them; they live below both so
//! that neither imports the other's internals.

use super::{check_len, WireError};

pub const IPV4_HEADER_LEN: usize = 20;
pub const IPV6_HEADER_LEN: usize = 40;
pub const UDP_HEADER_LEN: usize = 8;

/// Length of the IP header at the start of `buf`: 20 for IPv4 without options, 40 for IPv6.
pub(crate) fn ip_header_len(buf: &[u8]) -> Result<usize, WireError> {
    check_len(buf, 1)?;
    match buf[0] >> 4 {
        4 if buf[0] & 0x0f == 5 => Ok(IPV4_HEADER_LEN),
        4 => Err(WireError::UnsupportedIp("IPv4 options")),
        6 => Ok(IPV6_HEADER_LEN),
        v => Err(WireError::BadIpVersion(v)),
    }
}
