//! The IBA opcode table (PKT-OP-1): for every opcode this HCA knows, its value,
//! spec name, service type, the extended headers that follow the BTH, whether a
//! payload is allowed, its position in a message and the operation it belongs
//! to. Everything else in `wire` (header parsing, lengths, emission) is driven
//! by this one table instead of per-opcode branches (DESIGN rule 3).

use bitflags::bitflags;

bitflags! {
    /// The set of extended headers after the BTH. The bit order is the order
    /// the headers appear on the wire (PKT-OP-4), so iterating the set yields
    /// them in wire order.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct ExtHeaders: u16 {
        /// Reliable Datagram Extended Transport Header (4 bytes).
        const RDETH = 1 << 0;
        /// Datagram Extended Transport Header (8 bytes).
        const DETH = 1 << 1;
        /// XRC Extended Transport Header (4 bytes): first after the BTH on every XRC
        /// request (IBA Annex A14).
        const XRCETH = 1 << 2;
        /// RDMA Extended Transport Header (16 bytes).
        const RETH = 1 << 3;
        /// Atomic Extended Transport Header (28 bytes).
        const ATOMIC_ETH = 1 << 4;
        /// ACK Extended Transport Header (4 bytes).
        const AETH = 1 << 5;
        /// Atomic ACK Extended Transport Header (8 bytes).
        const ATOMIC_ACK_ETH = 1 << 6;
        /// Immediate Data (4 bytes).
        const IMMDT = 1 << 7;
        /// Invalidate Extended Transport Header (4 bytes).
        const IETH = 1 << 8;
    }
}

/// Byte sizes of the extended headers, in bit order of [`ExtHeaders`].
const EXT_HEADER_LEN: [usize; EXT_HEADERS] = [4, 8, 4, 16, 28, 4, 8, 4, 4];
/// How many extended headers there are (the bits of [`ExtHeaders`]).
const EXT_HEADERS: usize = 9;

/// The total length of every set of extended headers, by its bits: a packet's layout asks
/// several times per packet, and a lookup is what a table-driven path should cost (the sum
/// over the bits took some 40 instructions a time).
const SET_LEN: [u8; 1 << EXT_HEADERS] = {
    let mut t = [0u8; 1 << EXT_HEADERS];
    let mut bits = 0;
    while bits < 1 << EXT_HEADERS {
        let mut i = 0;
        while i < EXT_HEADERS {
            if bits & (1 << i) != 0 {
                t[bits] += EXT_HEADER_LEN[i] as u8;
            }
            i += 1;
        }
        bits += 1;
    }
    t
};

impl ExtHeaders {
    /// Total length in bytes of the headers in this set.
    pub const fn header_len(self) -> usize {
        SET_LEN[self.bits() as usize] as usize
    }

    /// Byte offset of `header` from the end of the BTH when the packet carries
    /// the headers in `self` (PKT-OP-4 order), or `None` if `header` is not in
    /// the set. `header` must be a single flag.
    pub const fn offset_of(self, header: ExtHeaders) -> Option<usize> {
        if !self.contains(header) || header.bits().count_ones() != 1 {
            return None;
        }
        let before = ExtHeaders::from_bits_retain(self.bits() & (header.bits() - 1));
        Some(before.header_len())
    }
}

/// Service type of an opcode: bits 7:5 of the opcode value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ServiceType {
    /// Reliable Connection (000).
    Rc,
    /// Unreliable Connection (001).
    Uc,
    /// Reliable Datagram (010).
    Rd,
    /// Unreliable Datagram (011).
    Ud,
    /// RoCEv2 Congestion Notification Packet (100).
    Cnp,
    /// Extended Reliable Connected (101), IBA Annex A14.
    Xrc,
}

impl ServiceType {
    /// RC, UC and XRC: a QP of the service has one peer (its datagrams one flow).
    pub const fn is_connected(self) -> bool {
        matches!(self, ServiceType::Rc | ServiceType::Uc | ServiceType::Xrc)
    }
}

/// The operation an opcode belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    Send,
    RdmaWrite,
    RdmaReadRequest,
    RdmaReadResponse,
    Acknowledge,
    AtomicAcknowledge,
    CompareSwap,
    FetchAdd,
    /// An 8-byte store done atomically at the responder (IBA 1.5, RC only), acknowledged by an
    /// RDMA Read Response Only with no payload, as rxe answers it.
    AtomicWrite,
    /// RD Resync.
    Resync,
    /// RoCEv2 congestion notification (PKT-ROCE-12).
    Cnp,
}

/// Where a packet sits in its message. Single-packet operations (ACKs, Read
/// requests, Atomics, CNP) are `Only`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Position {
    First,
    Middle,
    Last,
    Only,
}

impl Position {
    /// The position of a packet that is (or is not) the first and the last of its message.
    pub const fn of(first: bool, last: bool) -> Position {
        match (first, last) {
            (true, true) => Position::Only,
            (true, false) => Position::First,
            (false, false) => Position::Middle,
            (false, true) => Position::Last,
        }
    }
}

/// What tells apart the opcodes of one service, operation and position: Immediate Data, an
/// R_Key to invalidate, or neither.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Suffix {
    Plain,
    Immediate,
    Invalidate,
}

/// Whether an opcode is sent by the requester (SQ Logic) or the responder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    Request,
    Response,
}

/// One row of the opcode table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpcodeInfo {
    pub opcode: Opcode,
    /// The BTH:OpCode byte.
    pub value: u8,
    /// The spec name, e.g. `RC_SEND_FIRST`.
    pub name: &'static str,
    pub service: ServiceType,
    pub operation: Operation,
    pub position: Position,
    pub direction: Direction,
    /// Extended headers after the BTH, in wire order (PKT-OP-4).
    pub headers: ExtHeaders,
    /// Whether the packet may carry a payload (PKT-OP-2).
    pub payload: bool,
    /// Whether BTH:SE is meaningful: last/only packets of Sends and of RDMA
    /// Writes with Immediate.
    pub solicited_event: bool,
    /// Reserved bytes after the extended headers, sent as 0 and ignored on
    /// receipt (16 for a CNP, PKT-ROCE-12; 0 otherwise).
    pub reserved_len: u8,
}

impl OpcodeInfo {
    /// Whether the packet carries Immediate Data.
    pub const fn has_immediate(&self) -> bool {
        self.headers.contains(ExtHeaders::IMMDT)
    }

    /// Whether the packet carries an R_Key to invalidate.
    pub const fn has_invalidate(&self) -> bool {
        self.headers.contains(ExtHeaders::IETH)
    }

    /// Whether the requester sends this opcode.
    pub const fn is_request(&self) -> bool {
        matches!(self.direction, Direction::Request)
    }

    /// Bytes between the end of the BTH and the payload.
    pub const fn ext_len(&self) -> usize {
        self.headers.header_len() + self.reserved_len as usize
    }
}

/// Shorthands for the header column of the table.
const NONE: ExtHeaders = ExtHeaders::empty();
const IMM: ExtHeaders = ExtHeaders::IMMDT;
const IETH: ExtHeaders = ExtHeaders::IETH;
const RETH: ExtHeaders = ExtHeaders::RETH;
const RETH_IMM: ExtHeaders = ExtHeaders::RETH.union(ExtHeaders::IMMDT);
const AETH: ExtHeaders = ExtHeaders::AETH;
const ATOMIC_ACK: ExtHeaders = ExtHeaders::AETH.union(ExtHeaders::ATOMIC_ACK_ETH);
const ATOMIC: ExtHeaders = ExtHeaders::ATOMIC_ETH;
const DETH: ExtHeaders = ExtHeaders::DETH;
const DETH_IMM: ExtHeaders = ExtHeaders::DETH.union(ExtHeaders::IMMDT);
/// RD requests carry RDETH then DETH; RD responses carry RDETH only.
const RD_REQ: ExtHeaders = ExtHeaders::RDETH.union(ExtHeaders::DETH);
const RD_REQ_IMM: ExtHeaders = RD_REQ.union(ExtHeaders::IMMDT);
const RD_REQ_RETH: ExtHeaders = RD_REQ.union(ExtHeaders::RETH);
const RD_REQ_RETH_IMM: ExtHeaders = RD_REQ_RETH.union(ExtHeaders::IMMDT);
const RD_REQ_ATOMIC: ExtHeaders = RD_REQ.union(ExtHeaders::ATOMIC_ETH);
const RD_RESP: ExtHeaders = ExtHeaders::RDETH;
const RD_RESP_AETH: ExtHeaders = ExtHeaders::RDETH.union(ExtHeaders::AETH);
const RD_ATOMIC_ACK: ExtHeaders = RD_RESP_AETH.union(ExtHeaders::ATOMIC_ACK_ETH);
/// XRC requests carry the XRCETH first, then RC's headers; XRC responses are RC's.
const XRC: ExtHeaders = ExtHeaders::XRCETH;
const XRC_IMM: ExtHeaders = XRC.union(ExtHeaders::IMMDT);
const XRC_IETH: ExtHeaders = XRC.union(ExtHeaders::IETH);
const XRC_RETH: ExtHeaders = XRC.union(ExtHeaders::RETH);
const XRC_RETH_IMM: ExtHeaders = XRC_RETH.union(ExtHeaders::IMMDT);
const XRC_ATOMIC: ExtHeaders = XRC.union(ExtHeaders::ATOMIC_ETH);

/// Defines [`Opcode`] and [`OPCODES`] from one list of rows, so the enum and the
/// table cannot drift apart.
macro_rules! opcode_table {
    ($( $variant:ident = $value:literal, $name:literal, $svc:ident, $op:ident, $pos:ident,
        $dir:ident, $hdrs:expr, payload $payload:literal, se $se:literal
        $(, reserved $res:literal)?; )*) => {
        /// A BTH:OpCode. Values the table does not list decode to
        /// [`Opcode::Reserved`] (the transport treats them per PKT-OP-3/5);
        /// decoding never fails. A listed opcode's discriminant is its value, so that
        /// [`Opcode::value`] is one load, not a match over some sixty variants (the packet
        /// path asks it about fifteen times a round trip).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum Opcode {
            $( #[doc = $name] $variant = $value, )*
            /// A value the table does not list. Build it only through
            /// `Opcode::from(u8)`, which never wraps a listed value.
            Reserved(u8) = RESERVED_TAG,
        }

        /// The opcode table: one row per opcode this HCA knows (PKT-OP-1).
        pub const OPCODES: &[OpcodeInfo] = &[
            $( OpcodeInfo {
                opcode: Opcode::$variant,
                value: $value,
                name: $name,
                service: ServiceType::$svc,
                operation: Operation::$op,
                position: Position::$pos,
                direction: Direction::$dir,
                headers: $hdrs,
                payload: $payload,
                solicited_event: $se,
                reserved_len: 0 $( + $res )?,
            }, )*
        ];

        impl Opcode {
            /// The BTH:OpCode byte.
            #[inline]
            pub const fn value(self) -> u8 {
                match self {
                    Opcode::Reserved(v) => v,
                    // SAFETY: `Opcode` is `repr(u8)`, so its first byte is the discriminant
                    // (the Reference, "Primitive representation of enums with fields"), and
                    // a listed variant's discriminant is its value.
                    _ => unsafe { *(&self as *const Opcode).cast::<u8>() },
                }
            }
        }
    };
}

opcode_table! {
    // RC (000)
    RcSendFirst = 0x00, "RC_SEND_FIRST", Rc, Send, First, Request, NONE, payload true, se false;
    RcSendMiddle = 0x01, "RC_SEND_MIDDLE", Rc, Send, Middle, Request, NONE, payload true, se false;
    RcSendLast = 0x02, "RC_SEND_LAST", Rc, Send, Last, Request, NONE, payload true, se true;
    RcSendLastWithImmediate = 0x03, "RC_SEND_LAST_WITH_IMMEDIATE", Rc, Send, Last, Request, IMM, payload true, se true;
    RcSendOnly = 0x04, "RC_SEND_ONLY", Rc, Send, Only, Request, NONE, payload true, se true;
    RcSendOnlyWithImmediate = 0x05, "RC_SEND_ONLY_WITH_IMMEDIATE", Rc, Send, Only, Request, IMM, payload true, se true;
    RcRdmaWriteFirst = 0x06, "RC_RDMA_WRITE_FIRST", Rc, RdmaWrite, First, Request, RETH, payload true, se false;
    RcRdmaWriteMiddle = 0x07, "RC_RDMA_WRITE_MIDDLE", Rc, RdmaWrite, Middle, Request, NONE, payload true, se false;
    RcRdmaWriteLast = 0x08, "RC_RDMA_WRITE_LAST", Rc, RdmaWrite, Last, Request, NONE, payload true, se false;
    RcRdmaWriteLastWithImmediate = 0x09, "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE", Rc, RdmaWrite, Last, Request, IMM, payload true, se true;
    RcRdmaWriteOnly = 0x0A, "RC_RDMA_WRITE_ONLY", Rc, RdmaWrite, Only, Request, RETH, payload true, se false;
    RcRdmaWriteOnlyWithImmediate = 0x0B, "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", Rc, RdmaWrite, Only, Request, RETH_IMM, payload true, se true;
    RcRdmaReadRequest = 0x0C, "RC_RDMA_READ_REQUEST", Rc, RdmaReadRequest, Only, Request, RETH, payload false, se false;
    RcRdmaReadResponseFirst = 0x0D, "RC_RDMA_READ_RESPONSE_FIRST", Rc, RdmaReadResponse, First, Response, AETH, payload true, se false;
    RcRdmaReadResponseMiddle = 0x0E, "RC_RDMA_READ_RESPONSE_MIDDLE", Rc, RdmaReadResponse, Middle, Response, NONE, payload true, se false;
    RcRdmaReadResponseLast = 0x0F, "RC_RDMA_READ_RESPONSE_LAST", Rc, RdmaReadResponse, Last, Response, AETH, payload true, se false;
    RcRdmaReadResponseOnly = 0x10, "RC_RDMA_READ_RESPONSE_ONLY", Rc, RdmaReadResponse, Only, Response, AETH, payload true, se false;
    RcAcknowledge = 0x11, "RC_ACKNOWLEDGE", Rc, Acknowledge, Only, Response, AETH, payload false, se false;
    RcAtomicAcknowledge = 0x12, "RC_ATOMIC_ACKNOWLEDGE", Rc, AtomicAcknowledge, Only, Response, ATOMIC_ACK, payload false, se false;
    RcCompareSwap = 0x13, "RC_COMPARE_SWAP", Rc, CompareSwap, Only, Request, ATOMIC, payload false, se false;
    RcFetchAdd = 0x14, "RC_FETCH_ADD", Rc, FetchAdd, Only, Request, ATOMIC, payload false, se false;
    RcSendLastWithInvalidate = 0x16, "RC_SEND_LAST_WITH_INVALIDATE", Rc, Send, Last, Request, IETH, payload true, se true;
    RcSendOnlyWithInvalidate = 0x17, "RC_SEND_ONLY_WITH_INVALIDATE", Rc, Send, Only, Request, IETH, payload true, se true;
    RcAtomicWrite = 0x1D, "RC_ATOMIC_WRITE", Rc, AtomicWrite, Only, Request, RETH, payload true, se false;

    // UC (001)
    UcSendFirst = 0x20, "UC_SEND_FIRST", Uc, Send, First, Request, NONE, payload true, se false;
    UcSendMiddle = 0x21, "UC_SEND_MIDDLE", Uc, Send, Middle, Request, NONE, payload true, se false;
    UcSendLast = 0x22, "UC_SEND_LAST", Uc, Send, Last, Request, NONE, payload true, se true;
    UcSendLastWithImmediate = 0x23, "UC_SEND_LAST_WITH_IMMEDIATE", Uc, Send, Last, Request, IMM, payload true, se true;
    UcSendOnly = 0x24, "UC_SEND_ONLY", Uc, Send, Only, Request, NONE, payload true, se true;
    UcSendOnlyWithImmediate = 0x25, "UC_SEND_ONLY_WITH_IMMEDIATE", Uc, Send, Only, Request, IMM, payload true, se true;
    UcRdmaWriteFirst = 0x26, "UC_RDMA_WRITE_FIRST", Uc, RdmaWrite, First, Request, RETH, payload true, se false;
    UcRdmaWriteMiddle = 0x27, "UC_RDMA_WRITE_MIDDLE", Uc, RdmaWrite, Middle, Request, NONE, payload true, se false;
    UcRdmaWriteLast = 0x28, "UC_RDMA_WRITE_LAST", Uc, RdmaWrite, Last, Request, NONE, payload true, se false;
    UcRdmaWriteLastWithImmediate = 0x29, "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE", Uc, RdmaWrite, Last, Request, IMM, payload true, se true;
    UcRdmaWriteOnly = 0x2A, "UC_RDMA_WRITE_ONLY", Uc, RdmaWrite, Only, Request, RETH, payload true, se false;
    UcRdmaWriteOnlyWithImmediate = 0x2B, "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", Uc, RdmaWrite, Only, Request, RETH_IMM, payload true, se true;

    // RD (010): RDETH on every packet, DETH on every request.
    RdSendFirst = 0x40, "RD_SEND_FIRST", Rd, Send, First, Request, RD_REQ, payload true, se false;
    RdSendMiddle = 0x41, "RD_SEND_MIDDLE", Rd, Send, Middle, Request, RD_REQ, payload true, se false;
    RdSendLast = 0x42, "RD_SEND_LAST", Rd, Send, Last, Request, RD_REQ, payload true, se true;
    RdSendLastWithImmediate = 0x43, "RD_SEND_LAST_WITH_IMMEDIATE", Rd, Send, Last, Request, RD_REQ_IMM, payload true, se true;
    RdSendOnly = 0x44, "RD_SEND_ONLY", Rd, Send, Only, Request, RD_REQ, payload true, se true;
    RdSendOnlyWithImmediate = 0x45, "RD_SEND_ONLY_WITH_IMMEDIATE", Rd, Send, Only, Request, RD_REQ_IMM, payload true, se true;
    RdRdmaWriteFirst = 0x46, "RD_RDMA_WRITE_FIRST", Rd, RdmaWrite, First, Request, RD_REQ_RETH, payload true, se false;
    RdRdmaWriteMiddle = 0x47, "RD_RDMA_WRITE_MIDDLE", Rd, RdmaWrite, Middle, Request, RD_REQ, payload true, se false;
    RdRdmaWriteLast = 0x48, "RD_RDMA_WRITE_LAST", Rd, RdmaWrite, Last, Request, RD_REQ, payload true, se false;
    RdRdmaWriteLastWithImmediate = 0x49, "RD_RDMA_WRITE_LAST_WITH_IMMEDIATE", Rd, RdmaWrite, Last, Request, RD_REQ_IMM, payload true, se true;
    RdRdmaWriteOnly = 0x4A, "RD_RDMA_WRITE_ONLY", Rd, RdmaWrite, Only, Request, RD_REQ_RETH, payload true, se false;
    RdRdmaWriteOnlyWithImmediate = 0x4B, "RD_RDMA_WRITE_ONLY_WITH_IMMEDIATE", Rd, RdmaWrite, Only, Request, RD_REQ_RETH_IMM, payload true, se true;
    RdRdmaReadRequest = 0x4C, "RD_RDMA_READ_REQUEST", Rd, RdmaReadRequest, Only, Request, RD_REQ_RETH, payload false, se false;
    RdRdmaReadResponseFirst = 0x4D, "RD_RDMA_READ_RESPONSE_FIRST", Rd, RdmaReadResponse, First, Response, RD_RESP_AETH, payload true, se false;
    RdRdmaReadResponseMiddle = 0x4E, "RD_RDMA_READ_RESPONSE_MIDDLE", Rd, RdmaReadResponse, Middle, Response, RD_RESP, payload true, se false;
    RdRdmaReadResponseLast = 0x4F, "RD_RDMA_READ_RESPONSE_LAST", Rd, RdmaReadResponse, Last, Response, RD_RESP_AETH, payload true, se false;
    RdRdmaReadResponseOnly = 0x50, "RD_RDMA_READ_RESPONSE_ONLY", Rd, RdmaReadResponse, Only, Response, RD_RESP_AETH, payload true, se false;
    RdAcknowledge = 0x51, "RD_ACKNOWLEDGE", Rd, Acknowledge, Only, Response, RD_RESP_AETH, payload false, se false;
    RdAtomicAcknowledge = 0x52, "RD_ATOMIC_ACKNOWLEDGE", Rd, AtomicAcknowledge, Only, Response, RD_ATOMIC_ACK, payload false, se false;
    RdCompareSwap = 0x53, "RD_COMPARE_SWAP", Rd, CompareSwap, Only, Request, RD_REQ_ATOMIC, payload false, se false;
    RdFetchAdd = 0x54, "RD_FETCH_ADD", Rd, FetchAdd, Only, Request, RD_REQ_ATOMIC, payload false, se false;
    RdResync = 0x55, "RD_RESYNC", Rd, Resync, Only, Request, RD_REQ, payload false, se false;

    // UD (011)
    UdSendOnly = 0x64, "UD_SEND_ONLY", Ud, Send, Only, Request, DETH, payload true, se true;
    UdSendOnlyWithImmediate = 0x65, "UD_SEND_ONLY_WITH_IMMEDIATE", Ud, Send, Only, Request, DETH_IMM, payload true, se true;

    // CNP (100), RoCEv2: BTH then 16 reserved bytes (PKT-ROCE-12).
    Cnp = 0x81, "CNP", Cnp, Cnp, Only, Request, NONE, payload false, se false, reserved 16;

    // XRC (101), IBA Annex A14: RC's opcodes, the XRCETH first on every request.
    XrcSendFirst = 0xA0, "XRC_SEND_FIRST", Xrc, Send, First, Request, XRC, payload true, se false;
    XrcSendMiddle = 0xA1, "XRC_SEND_MIDDLE", Xrc, Send, Middle, Request, XRC, payload true, se false;
    XrcSendLast = 0xA2, "XRC_SEND_LAST", Xrc, Send, Last, Request, XRC, payload true, se true;
    XrcSendLastWithImmediate = 0xA3, "XRC_SEND_LAST_WITH_IMMEDIATE", Xrc, Send, Last, Request, XRC_IMM, payload true, se true;
    XrcSendOnly = 0xA4, "XRC_SEND_ONLY", Xrc, Send, Only, Request, XRC, payload true, se true;
    XrcSendOnlyWithImmediate = 0xA5, "XRC_SEND_ONLY_WITH_IMMEDIATE", Xrc, Send, Only, Request, XRC_IMM, payload true, se true;
    XrcRdmaWriteFirst = 0xA6, "XRC_RDMA_WRITE_FIRST", Xrc, RdmaWrite, First, Request, XRC_RETH, payload true, se false;
    XrcRdmaWriteMiddle = 0xA7, "XRC_RDMA_WRITE_MIDDLE", Xrc, RdmaWrite, Middle, Request, XRC, payload true, se false;
    XrcRdmaWriteLast = 0xA8, "XRC_RDMA_WRITE_LAST", Xrc, RdmaWrite, Last, Request, XRC, payload true, se false;
    XrcRdmaWriteLastWithImmediate = 0xA9, "XRC_RDMA_WRITE_LAST_WITH_IMMEDIATE", Xrc, RdmaWrite, Last, Request, XRC_IMM, payload true, se true;
    XrcRdmaWriteOnly = 0xAA, "XRC_RDMA_WRITE_ONLY", Xrc, RdmaWrite, Only, Request, XRC_RETH, payload true, se false;
    XrcRdmaWriteOnlyWithImmediate = 0xAB, "XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", Xrc, RdmaWrite, Only, Request, XRC_RETH_IMM, payload true, se true;
    XrcRdmaReadRequest = 0xAC, "XRC_RDMA_READ_REQUEST", Xrc, RdmaReadRequest, Only, Request, XRC_RETH, payload false, se false;
    XrcRdmaReadResponseFirst = 0xAD, "XRC_RDMA_READ_RESPONSE_FIRST", Xrc, RdmaReadResponse, First, Response, AETH, payload true, se false;
    XrcRdmaReadResponseMiddle = 0xAE, "XRC_RDMA_READ_RESPONSE_MIDDLE", Xrc, RdmaReadResponse, Middle, Response, NONE, payload true, se false;
    XrcRdmaReadResponseLast = 0xAF, "XRC_RDMA_READ_RESPONSE_LAST", Xrc, RdmaReadResponse, Last, Response, AETH, payload true, se false;
    XrcRdmaReadResponseOnly = 0xB0, "XRC_RDMA_READ_RESPONSE_ONLY", Xrc, RdmaReadResponse, Only, Response, AETH, payload true, se false;
    XrcAcknowledge = 0xB1, "XRC_ACKNOWLEDGE", Xrc, Acknowledge, Only, Response, AETH, payload false, se false;
    XrcAtomicAcknowledge = 0xB2, "XRC_ATOMIC_ACKNOWLEDGE", Xrc, AtomicAcknowledge, Only, Response, ATOMIC_ACK, payload false, se false;
    XrcCompareSwap = 0xB3, "XRC_COMPARE_SWAP", Xrc, CompareSwap, Only, Request, XRC_ATOMIC, payload false, se false;
    XrcFetchAdd = 0xB4, "XRC_FETCH_ADD", Xrc, FetchAdd, Only, Request, XRC_ATOMIC, payload false, se false;
    XrcSendLastWithInvalidate = 0xB6, "XRC_SEND_LAST_WITH_INVALIDATE", Xrc, Send, Last, Request, XRC_IETH, payload true, se true;
    XrcSendOnlyWithInvalidate = 0xB7, "XRC_SEND_ONLY_WITH_INVALIDATE", Xrc, Send, Only, Request, XRC_IETH, payload true, se true;
}

/// Sentinel in [`BY_VALUE`] for a value the table does not list.
const UNLISTED: u8 = u8::MAX;

/// The discriminant of [`Opcode::Reserved`]: a value the table does not list (checked where
/// [`BY_VALUE`] is built), so that no listed opcode shares it.
const RESERVED_TAG: u8 = 0xFF;

/// Row index into [`OPCODES`] for every byte value, computed at compile time
/// from the table so decoding is one lookup.
static BY_VALUE: [u8; 256] = {
    let mut t = [UNLISTED; 256];
    let mut i = 0;
    while i < OPCODES.len() {
        assert!(OPCODES[i].value != RESERVED_TAG, "a listed opcode with the reserved tag");
        t[OPCODES[i].value as usize] = i as u8;
        i += 1;
    }
    t
};

impl OpcodeInfo {
    /// The suffix its headers give it.
    pub const fn suffix(&self) -> Suffix {
        if self.has_immediate() {
            Suffix::Immediate
        } else if self.has_invalidate() {
            Suffix::Invalidate
        } else {
            Suffix::Plain
        }
    }
}

/// The index of (service, operation, position, suffix) in [`BY_MEANING`].
const fn meaning(service: ServiceType, operation: Operation, position: Position, suffix: Suffix) -> usize {
    ((service as usize * OPERATIONS + operation as usize) * 4 + position as usize) * 3 + suffix as usize
}

const SERVICES: usize = ServiceType::Xrc as usize + 1;
const OPERATIONS: usize = Operation::Cnp as usize + 1;

/// Row index into [`OPCODES`] for every (service, operation, position, suffix), computed at
/// compile time from the table: the table read backwards, so that every opcode sent is chosen
/// by what it means (no opcode arithmetic). Two rows with one meaning fail the build.
static BY_MEANING: [u8; SERVICES * OPERATIONS * 4 * 3] = {
    let mut t = [UNLISTED; SERVICES * OPERATIONS * 4 * 3];
    let mut i = 0;
    while i < OPCODES.len() {
        let r = &OPCODES[i];
        let k = meaning(r.service, r.operation, r.position, r.suffix());
        assert!(t[k] == UNLISTED, "two opcodes with one meaning");
        t[k] = i as u8;
        i += 1;
    }
    t
};

impl From<u8> for Opcode {
    #[inline]
    fn from(v: u8) -> Self {
        OPCODES.get(BY_VALUE[v as usize] as usize).map_or(Opcode::Reserved(v), |row| row.opcode)
    }
}

impl From<Opcode> for u8 {
    #[inline]
    fn from(op: Opcode) -> u8 {
        op.value()
    }
}

impl Opcode {
    /// The table row, or `None` for a reserved opcode.
    #[inline]
    pub fn info(self) -> Option<&'static OpcodeInfo> {
        match self {
            Opcode::Reserved(_) => None,
            op => OPCODES.get(BY_VALUE[op.value() as usize] as usize),
        }
    }

    /// Whether the table does not list this opcode.
    #[inline]
    pub fn is_reserved(self) -> bool {
        self.info().is_none()
    }

    /// Whether the table lists this opcode as a response (an ACK, an atomic ACK, a Read
    /// response); a reserved opcode is none.
    #[inline]
    pub fn is_response(self) -> bool {
        self.info().is_some_and(|i| !i.is_request())
    }

    /// The service type encoded in bits 7:5, even for a reserved opcode (the
    /// transport needs it to tell PKT-OP-3 from PKT-VAL-9). `None` for the
    /// service ranges this HCA has no service for (110, 111).
    #[inline]
    pub fn service_range(self) -> Option<ServiceType> {
        match self.value() >> 5 {
            0b000 => Some(ServiceType::Rc),
            0b001 => Some(ServiceType::Uc),
            0b010 => Some(ServiceType::Rd),
            0b011 => Some(ServiceType::Ud),
            0b100 => Some(ServiceType::Cnp),
            0b101 => Some(ServiceType::Xrc),
            _ => None,
        }
    }

    /// The opcode of a `service` packet at `position` of an `operation`, with `suffix`, or
    /// `None` where the table has none (a UD RDMA Write, a middle packet of an Atomic, …).
    #[inline]
    pub fn lookup(service: ServiceType, operation: Operation, position: Position, suffix: Suffix) -> Option<Opcode> {
        let row = BY_MEANING[meaning(service, operation, position, suffix)];
        OPCODES.get(row as usize).map(|r| r.opcode)
    }

    /// The spec name, or `"RESERVED"`.
    pub fn name(self) -> &'static str {
        self.info().map_or("RESERVED", |row| row.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table of set lengths is the sum of its members' lengths, for every set.
    #[test]
    fn a_set_of_headers_is_as_long_as_its_members() {
        for bits in 0..1u16 << EXT_HEADERS {
            let set = ExtHeaders::from_bits_retain(bits);
            let sum: usize = (0..EXT_HEADERS).filter(|i| bits & (1 << i) != 0).map(|i| EXT_HEADER_LEN[i]).sum();
            assert_eq!(set.header_len(), sum, "{set:?}");
        }
    }
}
