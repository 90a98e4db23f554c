//! Atomic Extended Transport Header (28 bytes), PKT-HDR-1:
//! bytes 0-7 Virtual Address, 8-11 R_Key, 12-19 Swap (or Add) Data,
//! 20-27 Compare Data.

use super::field::{set_u32, set_u64, u32_at, u64_at};
use super::{header_view, WireError};

header_view!(
    /// A view over an AtomicETH.
    AtomicEth, 28
);

impl<T: AsRef<[u8]>> AtomicEth<T> {
    pub fn va(&self) -> u64 {
        u64_at(self.buffer.as_ref(), 0)
    }

    pub fn r_key(&self) -> u32 {
        u32_at(self.buffer.as_ref(), 8)
    }

    /// Swap Data of a Compare Swap, or Add Data of a Fetch Add.
    pub fn swap_add_data(&self) -> u64 {
        u64_at(self.buffer.as_ref(), 12)
    }

    /// Compare Data of a Compare Swap; sent as 0 and ignored for Fetch Add.
    pub fn compare_data(&self) -> u64 {
        u64_at(self.buffer.as_ref(), 20)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicEth<T> {
    pub fn set_va(&mut self, v: u64) {
        set_u64(self.buffer.as_mut(), 0, v);
    }

    pub fn set_r_key(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), 8, v);
    }

    pub fn set_swap_add_data(&mut self, v: u64) {
        set_u64(self.buffer.as_mut(), 12, v);
    }

    pub fn set_compare_data(&mut self, v: u64) {
        set_u64(self.buffer.as_mut(), 20, v);
    }
}

/// The fields of an AtomicETH. The header layout is the same for both atomics,
/// so the repr does not know which one it belongs to: a Fetch Add sender sets
/// `compare_data` to 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AtomicEthRepr {
    pub va: u64,
    pub r_key: u32,
    pub swap_add_data: u64,
    pub compare_data: u64,
}

impl AtomicEthRepr {
    pub const LEN: usize = 28;

    pub fn parse<T: AsRef<[u8]>>(h: &AtomicEth<T>) -> Result<Self, WireError> {
        Ok(AtomicEthRepr {
            va: h.va(),
            r_key: h.r_key(),
            swap_add_data: h.swap_add_data(),
            compare_data: h.compare_data(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        Self::LEN
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut AtomicEth<T>) {
        h.set_va(self.va);
        h.set_r_key(self.r_key);
        h.set_swap_add_data(self.swap_add_data);
        h.set_compare_data(self.compare_data);
    }
}
