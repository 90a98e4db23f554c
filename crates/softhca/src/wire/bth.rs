//! Base Transport Header (12 bytes), PKT-HDR-1.
//!
//! ```text
//! byte 0     OpCode
//! byte 1     SE(7) MigReq(6) PadCnt(5:4) TVer(3:0)
//! bytes 2-3  P_Key
//! byte 4     FECN(7) BECN(6) reserved(5:0)
//! bytes 5-7  DestQP
//! byte 8     AckReq(7) reserved(6:0)
//! bytes 9-11 PSN
//! ```

use super::field::{set_u16, set_u24, u16_at, u24_at};
use super::opcode::Opcode;
use super::psn::Psn;
use super::{header_view, WireError};

/// Byte offset of the resv8a byte that carries FECN/BECN; the ICRC masks it.
pub const BTH_RESV8A: usize = 4;
/// Byte offset of the byte that carries AckReq.
pub const BTH_ACKREQ: usize = 8;
/// Byte offset of the PSN, the BTH's last 3 bytes.
pub const BTH_PSN: usize = 9;

header_view!(
    /// A view over a Base Transport Header.
    Bth, 12
);

impl<T: AsRef<[u8]>> Bth<T> {
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    pub fn opcode(&self) -> Opcode {
        Opcode::from(self.b()[0])
    }

    /// Solicited Event.
    pub fn se(&self) -> bool {
        self.b()[1] & 0x80 != 0
    }

    pub fn mig_req(&self) -> bool {
        self.b()[1] & 0x40 != 0
    }

    /// Pad bytes after the payload (PKT-LEN-5).
    pub fn pad_cnt(&self) -> u8 {
        (self.b()[1] >> 4) & 0x3
    }

    /// Transport header version; 0 is the only one defined (PKT-VAL-3).
    pub fn tver(&self) -> u8 {
        self.b()[1] & 0x0f
    }

    pub fn p_key(&self) -> u16 {
        u16_at(self.b(), 2)
    }

    /// Forward explicit congestion notification (RoCEv2, resv8a bit 7).
    pub fn fecn(&self) -> bool {
        self.b()[BTH_RESV8A] & 0x80 != 0
    }

    /// Backward explicit congestion notification (RoCEv2, resv8a bit 6).
    pub fn becn(&self) -> bool {
        self.b()[BTH_RESV8A] & 0x40 != 0
    }

    pub fn dest_qp(&self) -> u32 {
        u24_at(self.b(), 5)
    }

    pub fn ack_req(&self) -> bool {
        self.b()[8] & 0x80 != 0
    }

    pub fn psn(&self) -> Psn {
        Psn::new(u24_at(self.b(), BTH_PSN))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Bth<T> {
    fn bm(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }

    fn set_bit(&mut self, byte: usize, mask: u8, on: bool) {
        let b = &mut self.bm()[byte];
        *b = if on { *b | mask } else { *b & !mask };
    }

    pub fn set_opcode(&mut self, op: Opcode) {
        self.bm()[0] = op.value();
    }

    pub fn set_se(&mut self, v: bool) {
        self.set_bit(1, 0x80, v);
    }

    pub fn set_mig_req(&mut self, v: bool) {
        self.set_bit(1, 0x40, v);
    }

    /// Only the low 2 bits of `v` fit.
    pub fn set_pad_cnt(&mut self, v: u8) {
        let b = &mut self.bm()[1];
        *b = (*b & !0x30) | ((v & 0x3) << 4);
    }

    /// Only the low 4 bits of `v` fit.
    pub fn set_tver(&mut self, v: u8) {
        let b = &mut self.bm()[1];
        *b = (*b & !0x0f) | (v & 0x0f);
    }

    pub fn set_p_key(&mut self, v: u16) {
        set_u16(self.bm(), 2, v);
    }

    pub fn set_fecn(&mut self, v: bool) {
        self.set_bit(BTH_RESV8A, 0x80, v);
    }

    pub fn set_becn(&mut self, v: bool) {
        self.set_bit(BTH_RESV8A, 0x40, v);
    }

    /// Only the low 24 bits of `v` fit.
    pub fn set_dest_qp(&mut self, v: u32) {
        set_u24(self.bm(), 5, v);
    }

    pub fn set_ack_req(&mut self, v: bool) {
        self.set_bit(8, 0x80, v);
    }

    pub fn set_psn(&mut self, v: Psn) {
        set_u24(self.bm(), BTH_PSN, v.value());
    }

    /// Zeroes the reserved bits of bytes 4 and 8 (PKT-HDR-2), keeping FECN,
    /// BECN and AckReq.
    pub fn clear_reserved(&mut self) {
        self.bm()[BTH_RESV8A] &= 0xc0;
        self.bm()[8] &= 0x80;
    }
}

/// The fields of a BTH. Reserved bits are not represented: they are emitted
/// as 0 and ignored on parse (PKT-HDR-2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BthRepr {
    pub opcode: Opcode,
    pub se: bool,
    pub mig_req: bool,
    /// 0..=3. [`PacketRepr::emit`](super::PacketRepr::emit) derives it from
    /// the payload length instead of trusting this field.
    pub pad_cnt: u8,
    /// 0..=15; 0 is the only defined version.
    pub tver: u8,
    pub p_key: u16,
    pub fecn: bool,
    pub becn: bool,
    /// 24 bits.
    pub dest_qp: u32,
    pub ack_req: bool,
    pub psn: Psn,
}

impl BthRepr {
    pub const LEN: usize = 12;

    /// Reads every field; a checked view cannot fail, the `Result` keeps the
    /// signature uniform with the headers that can.
    pub fn parse<T: AsRef<[u8]>>(bth: &Bth<T>) -> Result<Self, WireError> {
        Ok(BthRepr {
            opcode: bth.opcode(),
            se: bth.se(),
            mig_req: bth.mig_req(),
            pad_cnt: bth.pad_cnt(),
            tver: bth.tver(),
            p_key: bth.p_key(),
            fecn: bth.fecn(),
            becn: bth.becn(),
            dest_qp: bth.dest_qp(),
            ack_req: bth.ack_req(),
            psn: bth.psn(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        Self::LEN
    }

    /// Writes every byte of the header, reserved bits as 0.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, bth: &mut Bth<T>) {
        let b = bth.bm();
        b[0] = self.opcode.value();
        b[1] =
            (u8::from(self.se) << 7) | (u8::from(self.mig_req) << 6) | ((self.pad_cnt & 0x3) << 4) | (self.tver & 0x0f);
        set_u16(b, 2, self.p_key);
        b[BTH_RESV8A] = (u8::from(self.fecn) << 7) | (u8::from(self.becn) << 6);
        set_u24(b, 5, self.dest_qp);
        b[8] = u8::from(self.ack_req) << 7;
        set_u24(b, BTH_PSN, self.psn.value());
    }
}
