//! Immediate Data (4 bytes), PKT-HDR-1.

use super::field::{set_u32, u32_at};
use super::{header_view, WireError};

header_view!(
    /// A view over an ImmDt header.
    ImmDt, 4
);

impl<T: AsRef<[u8]>> ImmDt<T> {
    /// The immediate value as a big-endian integer, as verbs present it in
    /// network order.
    pub fn imm_data(&self) -> u32 {
        u32_at(self.buffer.as_ref(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ImmDt<T> {
    pub fn set_imm_data(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), 0, v);
    }
}

/// The fields of an ImmDt header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ImmDtRepr {
    pub imm_data: u32,
}

impl ImmDtRepr {
    pub const LEN: usize = 4;

    pub fn parse<T: AsRef<[u8]>>(h: &ImmDt<T>) -> Result<Self, WireError> {
        Ok(ImmDtRepr { imm_data: h.imm_data() })
    }

    pub const fn buffer_len(&self) -> usize {
        Self::LEN
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut ImmDt<T>) {
        h.set_imm_data(self.imm_data);
    }
}
