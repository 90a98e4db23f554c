//! XRC Extended Transport Header (4 bytes), IBA Annex A14: byte 0 reserved, bytes 1-3 the
//! XRC SRQ at the responder that a request is for (XRCSRQ). Every XRC request packet carries
//! it, right after the BTH; responses do not.

use super::field::{set_u24, u24_at};
use super::{header_view, WireError};

header_view!(
    /// A view over an XRCETH.
    XrcEth, 4
);

impl<T: AsRef<[u8]>> XrcEth<T> {
    /// The XRC SRQ number (24 bits).
    pub fn xrc_srq(&self) -> u32 {
        u24_at(self.buffer.as_ref(), 1)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> XrcEth<T> {
    /// Only the low 24 bits of `v` fit.
    pub fn set_xrc_srq(&mut self, v: u32) {
        set_u24(self.buffer.as_mut(), 1, v);
    }
}

/// The fields of an XRCETH; the reserved byte is emitted as 0 and ignored (PKT-HDR-2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct XrcEthRepr {
    /// 24 bits.
    pub xrc_srq: u32,
}

impl XrcEthRepr {
    pub const LEN: usize = 4;

    pub fn parse<T: AsRef<[u8]>>(h: &XrcEth<T>) -> Result<Self, WireError> {
        Ok(XrcEthRepr { xrc_srq: h.xrc_srq() })
    }

    pub const fn buffer_len(&self) -> usize {
        Self::LEN
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut XrcEth<T>) {
        h.buffer.as_mut()[0] = 0;
        h.set_xrc_srq(self.xrc_srq);
    }
}
