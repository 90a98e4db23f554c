//! Datagram Extended Transport Header (8 bytes), PKT-HDR-1:
//! bytes 0-3 Q_Key, byte 4 reserved, bytes 5-7 SrcQP.

use super::field::{set_u24, set_u32, u24_at, u32_at};
use super::{header_view, WireError};

header_view!(
    /// A view over a DETH.
    Deth, 8
);

impl<T: AsRef<[u8]>> Deth<T> {
    pub fn q_key(&self) -> u32 {
        u32_at(self.buffer.as_ref(), 0)
    }

    /// The sending QP (24 bits), PKT-UD-2.
    pub fn src_qp(&self) -> u32 {
        u24_at(self.buffer.as_ref(), 5)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Deth<T> {
    pub fn set_q_key(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), 0, v);
    }

    /// Only the low 24 bits of `v` fit.
    pub fn set_src_qp(&mut self, v: u32) {
        set_u24(self.buffer.as_mut(), 5, v);
    }
}

/// The fields of a DETH; the reserved byte is emitted as 0 and ignored
/// (PKT-HDR-2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DethRepr {
    pub q_key: u32,
    /// 24 bits.
    pub src_qp: u32,
}

impl DethRepr {
    pub const LEN: usize = 8;

    pub fn parse<T: AsRef<[u8]>>(h: &Deth<T>) -> Result<Self, WireError> {
        Ok(DethRepr { q_key: h.q_key(), src_qp: h.src_qp() })
    }

    pub const fn buffer_len(&self) -> usize {
        Self::LEN
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Deth<T>) {
        h.set_q_key(self.q_key);
        h.buffer.as_mut()[4] = 0;
        h.set_src_qp(self.src_qp);
    }
}
