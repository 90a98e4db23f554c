//! Atomic ACK Extended Transport Header (8 bytes), PKT-HDR-1:
//! bytes 0-7 Original Remote Data.

use super::field::{set_u64, u64_at};
use super::{header_view, WireError};

header_view!(
    /// A view over an AtomicAckETH.
    AtomicAckEth, 8
);

impl<T: AsRef<[u8]>> AtomicAckEth<T> {
    pub fn orig_remote_data(&self) -> u64 {
        u64_at(self.buffer.as_ref(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicAckEth<T> {
    pub fn set_orig_remote_data(&mut self, v: u64) {
        set_u64(self.buffer.as_mut(), 0, v);
    }
}

/// The fields of an AtomicAckETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AtomicAckEthRepr {
    pub orig_remote_data: u64,
}

impl AtomicAckEthRepr {
    pub const LEN: usize = 8;

    pub fn parse<T: AsRef<[u8]>>(h: &AtomicAckEth<T>) -> Result<Self, WireError> {
        Ok(AtomicAckEthRepr { orig_remote_data: h.orig_remote_data() })
    }

    pub const fn buffer_len(&self) -> usize {
        Self::LEN
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut AtomicAckEth<T>) {
        h.set_orig_remote_data(self.orig_remote_data);
    }
}
