//! A whole IBA transport packet as carried by RoCEv2: BTH, extended headers,
//! payload, pad and the 4-byte ICRC slot. Which extended headers follow and
//! whether a payload is allowed come from the opcode table (PKT-OP-1, PKT-OP-4).

use core::ops::Range;

use super::aeth::{Aeth, AethRepr};
use super::atomic_ack_eth::{AtomicAckEth, AtomicAckEthRepr};
use super::atomic_eth::{AtomicEth, AtomicEthRepr};
use super::bth::{Bth, BthRepr};
use super::deth::{Deth, DethRepr};
use super::ieth::{Ieth, IethRepr};
use super::immdt::{ImmDt, ImmDtRepr};
use super::opcode::{ExtHeaders, Opcode};
use super::psn::Psn;
use super::rdeth::{Rdeth, RdethRepr};
use super::reth::{Reth, RethRepr};
use super::xrceth::{XrcEth, XrcEthRepr};
use super::{check_len, WireError};

/// Length of the BTH.
pub const BTH_LEN: usize = 12;
/// Length of the ICRC that ends every RoCEv2 packet.
pub const ICRC_LEN: usize = 4;

/// Where things are in a checked packet.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Layout {
    headers: ExtHeaders,
    payload: Range<usize>,
    icrc: usize,
}

impl Layout {
    /// Checks `buf` against its opcode: PKT-HDR-3 (long enough for the
    /// headers, pad and ICRC), PKT-OP-2 (no payload where the opcode forbids
    /// one) and PKT-LEN-5 (payload + pad is a whole number of 4-byte words).
    fn of(buf: &[u8]) -> Result<Layout, WireError> {
        let bth = Bth::new_checked(buf)?;
        let opcode = bth.opcode();
        let pad = usize::from(bth.pad_cnt());
        // A reserved opcode gets no extended headers: everything after the BTH
        // is payload, so the transport still sees its BTH (PKT-OP-3, PKT-OP-5).
        let (headers, ext_len, payload_allowed) = match opcode.info() {
            Some(info) => (info.headers, info.ext_len(), info.payload),
            None => (ExtHeaders::empty(), 0, true),
        };
        let payload_start = BTH_LEN + ext_len;
        check_len(buf, payload_start + pad + ICRC_LEN)?;
        let icrc = buf.len() - ICRC_LEN;
        let payload_end = icrc - pad;
        if !payload_allowed && icrc > payload_start {
            return Err(WireError::UnexpectedPayload(opcode.value()));
        }
        if !(icrc - payload_start).is_multiple_of(4) {
            return Err(WireError::BadLength);
        }
        Ok(Layout { headers, payload: payload_start..payload_end, icrc })
    }

    fn ext(&self, header: ExtHeaders) -> Option<usize> {
        self.headers.offset_of(header).map(|off| BTH_LEN + off)
    }
}

/// A checked view over a transport packet (BTH through ICRC). The whole buffer
/// is the packet: its length decides the payload length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
    layout: Layout,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Checks the lengths against the opcode table (PKT-HDR-3, PKT-OP-2,
    /// PKT-LEN-5). A reserved opcode is accepted with no extended headers.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let layout = Layout::of(buffer.as_ref())?;
        Ok(Packet { buffer, layout })
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    fn ext_bytes(&self, header: ExtHeaders) -> Option<&[u8]> {
        self.layout.ext(header).and_then(|at| self.b().get(at..))
    }

    pub fn bth(&self) -> Bth<&[u8]> {
        Bth::new_unchecked(self.b())
    }

    pub fn opcode(&self) -> Opcode {
        self.bth().opcode()
    }

    /// The extended headers present, in wire order.
    pub fn ext_headers(&self) -> ExtHeaders {
        self.layout.headers
    }

    pub fn rdeth(&self) -> Option<Rdeth<&[u8]>> {
        self.ext_bytes(ExtHeaders::RDETH).map(Rdeth::new_unchecked)
    }

    pub fn deth(&self) -> Option<Deth<&[u8]>> {
        self.ext_bytes(ExtHeaders::DETH).map(Deth::new_unchecked)
    }

    pub fn xrceth(&self) -> Option<XrcEth<&[u8]>> {
        self.ext_bytes(ExtHeaders::XRCETH).map(XrcEth::new_unchecked)
    }

    pub fn reth(&self) -> Option<Reth<&[u8]>> {
        self.ext_bytes(ExtHeaders::RETH).map(Reth::new_unchecked)
    }

    pub fn atomic_eth(&self) -> Option<AtomicEth<&[u8]>> {
        self.ext_bytes(ExtHeaders::ATOMIC_ETH).map(AtomicEth::new_unchecked)
    }

    pub fn aeth(&self) -> Option<Aeth<&[u8]>> {
        self.ext_bytes(ExtHeaders::AETH).map(Aeth::new_unchecked)
    }

    pub fn atomic_ack_eth(&self) -> Option<AtomicAckEth<&[u8]>> {
        self.ext_bytes(ExtHeaders::ATOMIC_ACK_ETH).map(AtomicAckEth::new_unchecked)
    }

    pub fn immdt(&self) -> Option<ImmDt<&[u8]>> {
        self.ext_bytes(ExtHeaders::IMMDT).map(ImmDt::new_unchecked)
    }

    pub fn ieth(&self) -> Option<Ieth<&[u8]>> {
        self.ext_bytes(ExtHeaders::IETH).map(Ieth::new_unchecked)
    }

    /// Bytes from the start of the BTH to the start of the payload.
    pub fn header_len(&self) -> usize {
        self.layout.payload.start
    }

    /// Where the payload is in the buffer (pad excluded, PKT-LEN-5).
    pub fn payload_range(&self) -> Range<usize> {
        self.layout.payload.clone()
    }

    /// The payload, pad bytes excluded (PKT-LEN-5).
    pub fn payload(&self) -> &[u8] {
        self.b().get(self.layout.payload.clone()).unwrap_or_default()
    }

    /// Offset of the ICRC (the packet length minus 4).
    pub fn icrc_offset(&self) -> usize {
        self.layout.icrc
    }

    /// The received ICRC, as the integer the CRC produced (it is sent least
    /// significant byte first, PKT-ROCE-8).
    pub fn icrc(&self) -> u32 {
        let b = self.b();
        let at = self.layout.icrc;
        u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let range = self.layout.payload.clone();
        self.buffer.as_mut().get_mut(range).unwrap_or_default()
    }
}

/// A parsed or to-be-emitted transport packet. Each extended header is `Some`
/// exactly when the opcode table lists it for `bth.opcode`; emission checks
/// that (PKT-OP-1) rather than guessing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketRepr<'a> {
    pub bth: BthRepr,
    pub rdeth: Option<RdethRepr>,
    pub deth: Option<DethRepr>,
    pub xrceth: Option<XrcEthRepr>,
    pub reth: Option<RethRepr>,
    pub atomic_eth: Option<AtomicEthRepr>,
    pub aeth: Option<AethRepr>,
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
    pub immdt: Option<ImmDtRepr>,
    pub ieth: Option<IethRepr>,
    /// The payload without pad bytes.
    pub payload: &'a [u8],
}

impl BthRepr {
    /// A BTH with the given opcode, P_Key, DestQP and PSN and every flag
    /// clear: the usual starting point for building a packet.
    pub const fn new(opcode: Opcode, p_key: u16, dest_qp: u32, psn: Psn) -> BthRepr {
        BthRepr {
            opcode,
            se: false,
            mig_req: false,
            pad_cnt: 0,
            tver: 0,
            p_key,
            fecn: false,
            becn: false,
            dest_qp,
            ack_req: false,
            psn,
        }
    }
}

/// PadCnt for a payload length: the bytes up to the next multiple of 4
/// (PKT-LEN-5).
pub const fn pad_for(payload_len: usize) -> usize {
    (4 - payload_len % 4) % 4
}

impl<'a> PacketRepr<'a> {
    /// A packet with only a BTH and no payload; set the extended headers the
    /// opcode needs with struct update syntax.
    pub const fn new(bth: BthRepr) -> Self {
        PacketRepr {
            bth,
            rdeth: None,
            deth: None,
            xrceth: None,
            reth: None,
            atomic_eth: None,
            aeth: None,
            atomic_ack_eth: None,
            immdt: None,
            ieth: None,
            payload: &[],
        }
    }

    /// Parses a checked packet. The payload borrows from the packet's buffer. Always inlined:
    /// the repr (some 170 bytes) is then built where the caller keeps it (see
    /// `roce::parse_split`).
    #[inline(always)]
    pub fn parse(packet: &Packet<&'a [u8]>) -> Result<Self, WireError> {
        let buf: &'a [u8] = packet.buffer;
        Ok(PacketRepr {
            bth: BthRepr::parse(&packet.bth())?,
            rdeth: packet.rdeth().map(|h| RdethRepr::parse(&h)).transpose()?,
            deth: packet.deth().map(|h| DethRepr::parse(&h)).transpose()?,
            xrceth: packet.xrceth().map(|h| XrcEthRepr::parse(&h)).transpose()?,
            reth: packet.reth().map(|h| RethRepr::parse(&h)).transpose()?,
            atomic_eth: packet.atomic_eth().map(|h| AtomicEthRepr::parse(&h)).transpose()?,
            aeth: packet.aeth().map(|h| AethRepr::parse(&h)).transpose()?,
            atomic_ack_eth: packet.atomic_ack_eth().map(|h| AtomicAckEthRepr::parse(&h)).transpose()?,
            immdt: packet.immdt().map(|h| ImmDtRepr::parse(&h)).transpose()?,
            ieth: packet.ieth().map(|h| IethRepr::parse(&h)).transpose()?,
            payload: buf.get(packet.payload_range()).unwrap_or_default(),
        })
    }

    /// Checks and parses `buf` (BTH through ICRC) in one step.
    pub fn parse_bytes(buf: &'a [u8]) -> Result<Self, WireError> {
        PacketRepr::parse(&Packet::new_checked(buf)?)
    }

    /// The extended headers this repr holds.
    pub fn ext_headers(&self) -> ExtHeaders {
        let mut h = ExtHeaders::empty();
        h.set(ExtHeaders::RDETH, self.rdeth.is_some());
        h.set(ExtHeaders::DETH, self.deth.is_some());
        h.set(ExtHeaders::XRCETH, self.xrceth.is_some());
        h.set(ExtHeaders::RETH, self.reth.is_some());
        h.set(ExtHeaders::ATOMIC_ETH, self.atomic_eth.is_some());
        h.set(ExtHeaders::AETH, self.aeth.is_some());
        h.set(ExtHeaders::ATOMIC_ACK_ETH, self.atomic_ack_eth.is_some());
        h.set(ExtHeaders::IMMDT, self.immdt.is_some());
        h.set(ExtHeaders::IETH, self.ieth.is_some());
        h
    }

    /// Bytes between the BTH and the payload for this opcode (extended headers
    /// plus the CNP's reserved bytes).
    fn ext_len(&self) -> usize {
        self.bth.opcode.info().map_or(0, |info| info.ext_len())
    }

    /// Bytes from the BTH to the start of the payload.
    pub fn header_len(&self) -> usize {
        BTH_LEN + self.ext_len()
    }

    /// Bytes the packet occupies: headers, payload, pad and ICRC.
    pub fn buffer_len(&self) -> usize {
        self.buffer_len_with(self.payload.len())
    }

    fn buffer_len_with(&self, payload_len: usize) -> usize {
        self.header_len() + payload_len + pad_for(payload_len) + ICRC_LEN
    }

    /// Writes the packet into the start of `buf` and returns its length. The
    /// ICRC slot is zeroed: the ICRC also covers the IP and UDP headers, so
    /// [`RoceRepr::emit`](super::roce::RoceRepr::emit) or
    /// [`icrc::fill_datagram`](super::icrc::fill_datagram) fills it in.
    /// BTH:PadCnt is derived from the payload length, whatever `bth.pad_cnt`
    /// says (PKT-LEN-5).
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let range = self.emit_headers(self.payload.len(), buf)?;
        let dst = buf.get_mut(range).ok_or(WireError::BadLength)?;
        dst.copy_from_slice(self.payload);
        Ok(self.buffer_len())
    }

    /// Like [`emit`](Self::emit) for a payload of `payload_len` bytes that the
    /// caller writes itself into the returned range (so the transport can copy
    /// straight from registered memory). `self.payload` is ignored. Pad bytes
    /// are written as 0 (PKT-HDR-2) and the ICRC slot is zeroed.
    pub fn emit_headers(&self, payload_len: usize, buf: &mut [u8]) -> Result<Range<usize>, WireError> {
        let opcode = self.bth.opcode;
        let (headers, reserved_len, payload_allowed) = match opcode.info() {
            Some(info) => (info.headers, usize::from(info.reserved_len), info.payload),
            None => (ExtHeaders::empty(), 0, true),
        };
        if self.ext_headers() != headers {
            return Err(WireError::HeaderMismatch(opcode.value()));
        }
        if !payload_allowed && payload_len > 0 {
            return Err(WireError::UnexpectedPayload(opcode.value()));
        }
        let total = self.buffer_len_with(payload_len);
        check_len(buf, total)?;
        let buf = &mut buf[..total];
        let pad = pad_for(payload_len);

        let mut bth = self.bth;
        bth.pad_cnt = pad as u8;
        bth.emit(&mut Bth::new_unchecked(&mut buf[..BTH_LEN]));

        let mut at = BTH_LEN;
        if let Some(h) = self.rdeth {
            h.emit(&mut Rdeth::new_unchecked(&mut buf[at..]));
            at += RdethRepr::LEN;
        }
        if let Some(h) = self.deth {
            h.emit(&mut Deth::new_unchecked(&mut buf[at..]));
            at += DethRepr::LEN;
        }
        if let Some(h) = self.xrceth {
            h.emit(&mut XrcEth::new_unchecked(&mut buf[at..]));
            at += XrcEthRepr::LEN;
        }
        if let Some(h) = self.reth {
            h.emit(&mut Reth::new_unchecked(&mut buf[at..]));
            at += RethRepr::LEN;
        }
        if let Some(h) = self.atomic_eth {
            h.emit(&mut AtomicEth::new_unchecked(&mut buf[at..]));
            at += AtomicEthRepr::LEN;
        }
        if let Some(h) = self.aeth {
            h.emit(&mut Aeth::new_unchecked(&mut buf[at..]));
            at += AethRepr::LEN;
        }
        if let Some(h) = self.atomic_ack_eth {
            h.emit(&mut AtomicAckEth::new_unchecked(&mut buf[at..]));
            at += AtomicAckEthRepr::LEN;
        }
        if let Some(h) = self.immdt {
            h.emit(&mut ImmDt::new_unchecked(&mut buf[at..]));
            at += ImmDtRepr::LEN;
        }
        if let Some(h) = self.ieth {
            h.emit(&mut Ieth::new_unchecked(&mut buf[at..]));
            at += IethRepr::LEN;
        }
        buf[at..at + reserved_len].fill(0);
        at += reserved_len;
        let payload = at..at + payload_len;
        buf[payload.end..].fill(0);
        Ok(payload)
    }
}
