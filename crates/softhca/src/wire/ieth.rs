//! Invalidate Extended Transport Header (4 bytes), PKT-HDR-1:
//! the R_Key to invalidate.

use super::field::{set_u32, u32_at};
use super::{header_view, WireError};

header_view!(
    /// A view over an IETH.
    Ieth, 4
);

impl<T: AsRef<[u8]>> Ieth<T> {
    pub fn r_key(&self) -> u32 {
        u32_at(self.buffer.as_ref(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ieth<T> {
    pub fn set_r_key(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), 0, v);
    }
}

/// The fields of an IETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IethRepr {
    pub r_key: u32,
}

impl IethRepr {
    pub const LEN: usize = 4;

    pub fn parse<T: AsRef<[u8]>>(h: &Ieth<T>) -> Result<Self, WireError> {
        Ok(IethRepr { r_key: h.r_key() })
    }

    pub const fn buffer_len(&self) -> usize {
        Self::LEN
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Ieth<T>) {
        h.set_r_key(self.r_key);
    }
}
