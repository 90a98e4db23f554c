//! Reliable Datagram Extended Transport Header (4 bytes), PKT-HDR-1:
//! byte 0 reserved, bytes 1-3 EECnxt.

use super::field::{set_u24, u24_at};
use super::{header_view, WireError};

header_view!(
    /// A view over an RDETH.
    Rdeth, 4
);

impl<T: AsRef<[u8]>> Rdeth<T> {
    /// End-to-end context number (24 bits).
    pub fn ee_cnxt(&self) -> u32 {
        u24_at(self.buffer.as_ref(), 1)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Rdeth<T> {
    /// Only the low 24 bits of `v` fit.
    pub fn set_ee_cnxt(&mut self, v: u32) {
        set_u24(self.buffer.as_mut(), 1, v);
    }
}

/// The fields of an RDETH; the reserved byte is emitted as 0 and ignored
/// (PKT-HDR-2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RdethRepr {
    /// 24 bits.
    pub ee_cnxt: u32,
}

impl RdethRepr {
    pub const LEN: usize = 4;

    pub fn parse<T: AsRef<[u8]>>(h: &Rdeth<T>) -> Result<Self, WireError> {
        Ok(RdethRepr { ee_cnxt: h.ee_cnxt() })
    }

    pub const fn buffer_len(&self) -> usize {
        Self::LEN
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Rdeth<T>) {
        h.buffer.as_mut()[0] = 0;
        h.set_ee_cnxt(self.ee_cnxt);
    }
}
