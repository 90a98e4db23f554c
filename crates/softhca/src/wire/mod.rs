//! Wire formats: the InfiniBand transport headers, the opcode table, RoCEv2
//! encapsulation (IPv4/IPv6 + UDP), the ICRC and a pcap reader/writer.
//!
//! Every header comes in two forms, in the style of smoltcp's `wire` module
//! (DESIGN rule 2):
//! - a typed *view* over bytes, e.g. [`Bth<T>`](Bth), built with
//!   `new_checked` (which checks the length once so that the getters and setters
//!   cannot go out of bounds), and
//! - a plain *Repr* struct, e.g. [`BthRepr`], with `parse`, `emit`
//!   and `buffer_len`.
//!
//! Parsing is total: any byte string yields a value or a [`WireError`], never a
//! panic, and neither parsing nor emitting allocates.
//!
//! The entry points the transport and the links use:
//! - [`packet::PacketRepr`]: a whole IBA transport packet (BTH … payload, pad,
//!   ICRC slot), driven by the [`opcode`] table.
//! - [`roce`]: build a full IP/UDP/BTH…/ICRC datagram into a caller buffer
//!   ([`roce::RoceRepr::emit`]) and parse + verify an inbound datagram or
//!   Ethernet frame ([`roce::parse_ip`], [`roce::parse_ethernet`]).
//! - [`ack::AckTemplate`]: an ACK's datagram kept whole, for the responder that owes one
//!   per message: only its PSN, AETH and ICRC are written per packet.
//! - [`request::RequestHead`]: a plain request's headers kept per QP (a BTH and a payload
//!   alone: Sends, a Write's middle and last packets), the next of that shape a copy with
//!   its PSN written.
//! - [`icrc`]: the invariant CRC over a datagram, or over an IP/UDP header
//!   rebuilt by the caller plus the transport packet; it and `roce` take the
//!   IP/UDP framing lengths from [`ip`].
//! - [`pcap`]: a classic pcap writer and reader for taps.
//!
//! The wire imports nothing of the layers above it (transport, verbs, links).

pub mod ack;
pub mod aeth;
pub mod atomic_ack_eth;
pub mod atomic_eth;
pub mod bth;
pub mod deth;
mod field;
pub mod icrc;
pub mod ieth;
pub mod immdt;
pub mod ip;
pub mod mad;
pub mod opcode;
pub mod packet;
pub mod pcap;
pub mod psn;
pub mod rdeth;
pub mod request;
pub mod reth;
pub mod roce;
pub mod xrceth;

pub use ack::AckTemplate;
pub use aeth::{Aeth, AethRepr, NakCode, Syndrome};
pub use atomic_ack_eth::{AtomicAckEth, AtomicAckEthRepr};
pub use atomic_eth::{AtomicEth, AtomicEthRepr};
pub use bth::{Bth, BthRepr};
pub use deth::{Deth, DethRepr};
pub use ieth::{Ieth, IethRepr};
pub use immdt::{ImmDt, ImmDtRepr};
pub use opcode::{Direction, ExtHeaders, Opcode, OpcodeInfo, Operation, Position, ServiceType, Suffix, OPCODES};
pub use packet::{Packet, PacketRepr};
pub use psn::{Psn, PsnClass};
pub use rdeth::{Rdeth, RdethRepr};
pub use request::RequestHead;
pub use reth::{Reth, RethRepr};
pub use roce::{IpRepr, Ipv4Repr, Ipv6Repr, RoceDatagram, RoceRepr, UdpChecksum, ROCE_V2_PORT};
pub use xrceth::{XrcEth, XrcEthRepr};

/// Why a byte string is not a valid header, packet or datagram.
///
/// Every variant is something a peer can cause; the link or transport drops
/// the packet and counts it by reason (DESIGN rule 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The buffer is shorter than the headers (plus pad and ICRC) require
    /// (PKT-HDR-3).
    #[error("truncated: {needed} bytes needed, {len} available")]
    Truncated { needed: usize, len: usize },
    /// The opcode carries no payload but the packet has some (PKT-OP-2).
    #[error("opcode {0:#04x} carries no payload")]
    UnexpectedPayload(u8),
    /// The extended headers supplied for emission do not match the opcode table
    /// (PKT-OP-1).
    #[error("extended headers do not match opcode {0:#04x}")]
    HeaderMismatch(u8),
    /// A length field or the packet length is inconsistent (PKT-OP-2, PKT-LEN-5).
    #[error("inconsistent length")]
    BadLength,
    /// The IP version nibble is neither 4 nor 6.
    #[error("IP version {0} is not 4 or 6")]
    BadIpVersion(u8),
    /// A valid IP header that RoCEv2 never produces (options, fragments,
    /// extension headers) (PKT-ROCE-2).
    #[error("unsupported IP header: {0}")]
    UnsupportedIp(&'static str),
    /// The IPv4 header checksum is wrong.
    #[error("bad IPv4 header checksum")]
    BadIpChecksum,
    /// The IP payload is not UDP (protocol / next header is not 17).
    #[error("IP protocol {0} is not UDP")]
    NotUdp(u8),
    /// The UDP destination port is not the RoCEv2 port 4791 (PKT-ROCE-1).
    #[error("UDP destination port {0} is not RoCEv2")]
    NotRoce(u16),
    /// The Ethernet type is neither IPv4 nor IPv6.
    #[error("ethertype {0:#06x} is not IPv4 or IPv6")]
    BadEtherType(u16),
    /// The ICRC does not match the contents (PKT-VAL-2, PKT-ROCE-10).
    #[error("ICRC mismatch: computed {computed:#010x}, received {received:#010x}")]
    BadIcrc { computed: u32, received: u32 },
}

/// Fails with [`WireError::Truncated`] unless `buf` holds at least `needed` bytes.
#[inline]
pub(crate) fn check_len(buf: &[u8], needed: usize) -> Result<(), WireError> {
    if buf.len() < needed {
        Err(WireError::Truncated { needed, len: buf.len() })
    } else {
        Ok(())
    }
}

/// Declares a fixed-length header view: the struct, `new_checked`,
/// `new_unchecked`, `into_inner` and `as_bytes`. Generated so that every header
/// checks its length the same way.
macro_rules! header_view {
    ($(#[$meta:meta])* $name:ident, $len:expr) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// Length of this header in bytes.
            pub const LEN: usize = $len;

            /// Wraps `buffer` after checking it holds at least [`Self::LEN`]
            /// bytes; longer buffers are fine (the rest is ignored).
            pub fn new_checked(buffer: T) -> Result<Self, $crate::wire::WireError> {
                $crate::wire::check_len(buffer.as_ref(), $len)?;
                Ok(Self { buffer })
            }

            /// Wraps `buffer` whose length the caller has already checked;
            /// the accessors panic if it is shorter than [`Self::LEN`].
            #[allow(dead_code)]
            pub(crate) const fn new_unchecked(buffer: T) -> Self {
                Self { buffer }
            }

            /// Gives the underlying buffer back.
            pub fn into_inner(self) -> T {
                self.buffer
            }

            /// The header bytes (exactly [`Self::LEN`] of them).
            pub fn as_bytes(&self) -> &[u8] {
                &self.buffer.as_ref()[..$len]
            }
        }
    };
}
pub(crate) use header_view;
