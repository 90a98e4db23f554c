//! RDMA Extended Transport Header (16 bytes), PKT-HDR-1:
//! bytes 0-7 Virtual Address, 8-11 R_Key, 12-15 DMA Length.

use super::field::{set_u32, set_u64, u32_at, u64_at};
use super::{header_view, WireError};

header_view!(
    /// A view over a RETH.
    Reth, 16
);

impl<T: AsRef<[u8]>> Reth<T> {
    pub fn va(&self) -> u64 {
        u64_at(self.buffer.as_ref(), 0)
    }

    pub fn r_key(&self) -> u32 {
        u32_at(self.buffer.as_ref(), 8)
    }

    pub fn dma_length(&self) -> u32 {
        u32_at(self.buffer.as_ref(), 12)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Reth<T> {
    pub fn set_va(&mut self, v: u64) {
        set_u64(self.buffer.as_mut(), 0, v);
    }

    pub fn set_r_key(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), 8, v);
    }

    pub fn set_dma_length(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), 12, v);
    }
}

/// The fields of a RETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RethRepr {
    pub va: u64,
    pub r_key: u32,
    pub dma_length: u32,
}

impl RethRepr {
    pub const LEN: usize = 16;

    pub fn parse<T: AsRef<[u8]>>(h: &Reth<T>) -> Result<Self, WireError> {
        Ok(RethRepr { va: h.va(), r_key: h.r_key(), dma_length: h.dma_length() })
    }

    pub const fn buffer_len(&self) -> usize {
        Self::LEN
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Reth<T>) {
        h.set_va(self.va);
        h.set_r_key(self.r_key);
        h.set_dma_length(self.dma_length);
    }
}
