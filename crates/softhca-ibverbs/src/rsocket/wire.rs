//! What two rsocket ends say to each other, as librdmacm 44 says it: the connection data in
//! the REQ's and REP's private data, the 32-bit messages carried as immediate data, and the
//! buffer descriptors (`rs_sge`) one end writes into the other's memory.

/// `struct rs_sge` (16 bytes): memory a peer may write. Written into the other end's memory
/// in that end's byte order (the connection data's `CONN_FLAG_NET` says whether that is
/// network order; in the connection data itself the fields are always big-endian).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct RsSge {
    pub addr: u64,
    pub key: u32,
    pub length: u32,
}

/// `struct rs_iomap` (24 bytes): a region mapped for the peer to write (`riomap`), at the
/// offset the program chose; written into the peer's I/O map, in its byte order.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct RsIomap {
    pub offset: u64,
    pub sge: RsSge,
}

pub(super) const IOMAP_LEN: usize = 24;

impl RsIomap {
    /// The bytes as this host lays the structure out.
    pub fn to_bytes(self) -> [u8; IOMAP_LEN] {
        let mut b = [0u8; IOMAP_LEN];
        b[..8].copy_from_slice(&self.offset.to_ne_bytes());
        b[8..16].copy_from_slice(&self.sge.addr.to_ne_bytes());
        b[16..20].copy_from_slice(&self.sge.key.to_ne_bytes());
        b[20..].copy_from_slice(&self.sge.length.to_ne_bytes());
        b
    }

    /// For a peer of the other byte order.
    pub fn swapped(self) -> RsIomap {
        let s = self.sge;
        RsIomap {
            offset: self.offset.swap_bytes(),
            sge: RsSge { addr: s.addr.swap_bytes(), key: s.key.swap_bytes(), length: s.length.swap_bytes() },
        }
    }
}

/// The connection data's version and flags (`RS_CONN_FLAG_*`).
pub(super) const CONN_VERSION: u8 = 1;
/// The sender's host order is network order (big-endian).
pub(super) const CONN_FLAG_NET: u8 = 1 << 0;
/// The sender has an I/O map area after its SGL (`riomap`).
pub(super) const CONN_FLAG_IOMAP: u8 = 1 << 1;
/// Entries in an end's target SGL: the receive-buffer halves it was given (`RS_SGL_SIZE`).
pub(super) const SGL_SIZE: u32 = 2;

/// `struct rs_conn_data` (40 bytes), the private data of the REQ and of the REP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ConnData {
    pub version: u8,
    pub flags: u8,
    /// Receive credits: the sender's receive queue depth.
    pub credits: u16,
    /// The I/O map's entries, scaled (`rs_value_to_scale(n, 8)`).
    pub target_iomap_size: u8,
    /// The sender's target SGL: where the peer writes the buffers it offers.
    pub target_sgl: RsSge,
    /// The first half of the sender's receive buffer, offered at once.
    pub data_buf: RsSge,
}

pub(super) const CONN_DATA_LEN: usize = 40;

impl ConnData {
    /// The bytes on the wire: the SGEs in network order, the flags saying ours is not.
    pub fn to_bytes(self) -> [u8; CONN_DATA_LEN] {
        let mut b = [0u8; CONN_DATA_LEN];
        b[0] = self.version;
        b[1] = self.flags;
        b[2..4].copy_from_slice(&self.credits.to_be_bytes());
        b[7] = self.target_iomap_size;
        for (at, s) in [(8, self.target_sgl), (24, self.data_buf)] {
            b[at..at + 8].copy_from_slice(&s.addr.to_be_bytes());
            b[at + 8..at + 12].copy_from_slice(&s.key.to_be_bytes());
            b[at + 12..at + 16].copy_from_slice(&s.length.to_be_bytes());
        }
        b
    }

    /// Reads the connection data at the start of `b`; None if it is short.
    pub fn parse(b: &[u8]) -> Option<ConnData> {
        let b = b.get(..CONN_DATA_LEN)?;
        let sge = |at: usize| RsSge {
            addr: u64::from_be_bytes(b[at..at + 8].try_into().unwrap_or_default()),
            key: u32::from_be_bytes(b[at + 8..at + 12].try_into().unwrap_or_default()),
            length: u32::from_be_bytes(b[at + 12..at + 16].try_into().unwrap_or_default()),
        };
        Some(ConnData {
            version: b[0],
            flags: b[1],
            credits: u16::from_be_bytes([b[2], b[3]]),
            target_iomap_size: b[7],
            target_sgl: sge(8),
            data_buf: sge(24),
        })
    }
}

/// The operation in a message's top three bits (`RS_OP_*`).
pub(super) mod op {
    /// Data written into the receive buffer; the low 29 bits are its length.
    pub const DATA: u32 = 0;
    /// Not on the wire: a direct write into a peer's I/O map (a send's own bookkeeping).
    pub const WRITE: u32 = 2;
    /// A buffer offered (written into the target SGL) or credits alone; the low bits are the
    /// receive sequence number up to which the peer may send.
    pub const SGL: u32 = 4;
    /// An I/O map entry written; the low 16 bits are its index.
    pub const IOMAP_SGL: u32 = 6;
    /// Control: the low bits are one of `ctrl::*`.
    pub const CTRL: u32 = 7;
}

/// Control messages (`RS_CTRL_*`).
pub(super) mod ctrl {
    pub const DISCONNECT: u32 = 0;
    pub const KEEPALIVE: u32 = 1;
    pub const SHUTDOWN: u32 = 2;
}

/// A message: the operation in bits 31–29, its datum below.
pub(super) const fn msg(op: u32, data: u32) -> u32 {
    (op << 29) | (data & 0x1FFF_FFFF)
}
pub(super) const fn msg_op(m: u32) -> u32 {
    m >> 29
}
pub(super) const fn msg_data(m: u32) -> u32 {
    m & 0x1FFF_FFFF
}

/// A receive's work request ID carries this bit (`RS_WR_ID_FLAG_RECV`); a send's carries its
/// message.
pub(super) const WR_ID_RECV: u64 = 1 << 63;

/// librdmacm's 8-bit scale of a size: itself up to 128, else a flag and the size / 256.
pub(super) fn value_to_scale(value: u32, bits: u32) -> u32 {
    if value <= 1 << (bits - 1) {
        value
    } else {
        (1 << (bits - 1)) | (value >> bits)
    }
}

pub(super) fn scale_to_value(value: u32, bits: u32) -> u32 {
    if value <= 1 << (bits - 1) {
        value
    } else {
        (value & !(1 << (bits - 1))) << bits
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes librdmacm 44's `rs_format_conn_data` writes on a little-endian host for a
    /// socket of 384 receives, no I/O map, its SGL at 0x1000 (R_Key 0x11) and its buffer at
    /// 0x20000 (R_Key 0x22, 64 KiB offered).
    #[test]
    fn conn_data_layout() {
        let c = ConnData {
            version: CONN_VERSION,
            flags: CONN_FLAG_IOMAP,
            credits: 384,
            target_iomap_size: 0,
            target_sgl: RsSge { addr: 0x1000, key: 0x11, length: SGL_SIZE },
            data_buf: RsSge { addr: 0x20000, key: 0x22, length: 0x10000 },
        };
        let b = c.to_bytes();
        assert_eq!(&b[..8], &[1, 2, 0x01, 0x80, 0, 0, 0, 0]);
        assert_eq!(&b[8..24], &[0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0, 0x11, 0, 0, 0, 2]);
        assert_eq!(&b[24..40], &[0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0x22, 0, 1, 0, 0]);
        assert_eq!(ConnData::parse(&b), Some(c));
        assert_eq!(ConnData::parse(&b[..39]), None);
    }

    #[test]
    fn messages_and_scales() {
        assert_eq!(msg(op::SGL, 0x2000_0005), 0x8000_0005);
        assert_eq!(msg_op(msg(op::CTRL, ctrl::SHUTDOWN)), op::CTRL);
        assert_eq!(msg_data(msg(op::DATA, 65536)), 65536);
        assert_eq!(value_to_scale(100, 8), 100);
        assert_eq!(value_to_scale(1024, 8), 0x84);
        assert_eq!(scale_to_value(0x84, 8), 1024);
    }
}
