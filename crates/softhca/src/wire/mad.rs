//! Management datagrams (IBA 13.4): the 256-byte MADs the General Services Interface (QP1)
//! carries, and the connection manager's messages inside them (IBA 12.6, management class
//! 0x07): REQ, MRA, REJ, REP, RTU, DREQ, DREP, SIDR REQ and SIDR REP.
//!
//! The CM messages are tables of bit fields (IBA 12.6's tables 106-120 give each field's
//! byte, first bit and width, most significant bit first); here each message is one such table
//! (`cm_message!`) from which its `Repr`, `parse` and `emit` come, so a field is named once.
//! Every bit that is not a reserved one is in a `Repr`, so a message parses and re-emits byte
//! for byte (checked against Linux's CM exchanges in `tests/wire_mad.rs`).

use super::field::{set_u16, set_u32, set_u64, u16_at, u32_at, u64_at};
use super::WireError;

/// A MAD's length, header included.
pub const MAD_LEN: usize = 256;
/// The common MAD header.
pub const MAD_HEADER_LEN: usize = 24;
/// A CM message: the MAD's data.
pub const CM_DATA_LEN: usize = MAD_LEN - MAD_HEADER_LEN;
/// The communication management class (IBA 12.11) and its class version on RoCE.
pub const MGMT_CLASS_CM: u8 = 0x07;
pub const CM_CLASS_VERSION: u8 = 2;
/// MAD methods (IBA 13.4.5) the CM uses: all its messages are Sends.
pub const METHOD_SEND: u8 = 0x03;

/// The common MAD header (IBA 13.4.2, Table 145); bytes 18-19 are reserved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MadHeaderRepr {
    pub base_version: u8,
    pub mgmt_class: u8,
    pub class_version: u8,
    pub method: u8,
    pub status: u16,
    pub class_specific: u16,
    pub transaction_id: u64,
    pub attribute_id: u16,
    pub attribute_modifier: u32,
}

impl MadHeaderRepr {
    /// A CM Send of `attribute_id` with transaction `tid`.
    pub fn cm(attribute_id: u16, tid: u64) -> MadHeaderRepr {
        MadHeaderRepr {
            base_version: 1,
            mgmt_class: MGMT_CLASS_CM,
            class_version: CM_CLASS_VERSION,
            method: METHOD_SEND,
            transaction_id: tid,
            attribute_id,
            ..Default::default()
        }
    }

    /// The header of a MAD and its data (the 232 bytes after the header).
    pub fn parse(mad: &[u8]) -> Result<(MadHeaderRepr, &[u8]), WireError> {
        if mad.len() < MAD_LEN {
            return Err(WireError::Truncated { needed: MAD_LEN, len: mad.len() });
        }
        let h = MadHeaderRepr {
            base_version: mad[0],
            mgmt_class: mad[1],
            class_version: mad[2],
            method: mad[3],
            status: u16_at(mad, 4),
            class_specific: u16_at(mad, 6),
            transaction_id: u64_at(mad, 8),
            attribute_id: u16_at(mad, 16),
            attribute_modifier: u32_at(mad, 20),
        };
        Ok((h, &mad[MAD_HEADER_LEN..MAD_LEN]))
    }

    /// Writes the header into the first 24 bytes of a MAD buffer.
    pub fn emit(&self, mad: &mut [u8]) -> Result<(), WireError> {
        if mad.len() < MAD_HEADER_LEN {
            return Err(WireError::Truncated { needed: MAD_HEADER_LEN, len: mad.len() });
        }
        mad[..4].copy_from_slice(&[self.base_version, self.mgmt_class, self.class_version, self.method]);
        set_u16(mad, 4, self.status);
        set_u16(mad, 6, self.class_specific);
        set_u64(mad, 8, self.transaction_id);
        set_u16(mad, 16, self.attribute_id);
        set_u16(mad, 18, 0);
        set_u32(mad, 20, self.attribute_modifier);
        Ok(())
    }
}

/// A field of a CM message: `width` bits starting `bit` bits below the most significant bit
/// of byte `byte` of the message data, big-endian, at most 64 bits.
#[derive(Debug, Clone, Copy)]
struct Field {
    byte: usize,
    bit: u32,
    width: u32,
}

impl Field {
    /// The bytes the field spans, and how far its lowest bit is from their last bit.
    fn span(self) -> (usize, usize, u32) {
        let bytes = (self.bit + self.width).div_ceil(8) as usize;
        (self.byte, self.byte + bytes, bytes as u32 * 8 - self.bit - self.width)
    }

    fn mask(self) -> u64 {
        if self.width == 64 {
            u64::MAX
        } else {
            (1u64 << self.width) - 1
        }
    }

    /// The caller has checked that `d` holds the whole message.
    fn get(self, d: &[u8]) -> u64 {
        let (from, to, shift) = self.span();
        let v = d[from..to].iter().fold(0u128, |v, b| v << 8 | u128::from(*b));
        (v >> shift) as u64 & self.mask()
    }

    fn set(self, d: &mut [u8], value: u64) {
        let (from, to, shift) = self.span();
        let mut v = d[from..to].iter().fold(0u128, |v, b| v << 8 | u128::from(*b));
        let mask = u128::from(self.mask()) << shift;
        v = (v & !mask) | ((u128::from(value) << shift) & mask);
        for (i, b) in d[from..to].iter_mut().enumerate().rev() {
            *b = (v >> (8 * (to - from - 1 - i))) as u8;
        }
    }
}

/// One CM message as a table: integer fields as (byte, first bit, width) and byte strings
/// (GIDs, additional information, private data) as (byte, length). Gives the `Repr` with
/// `parse` (of the 232 bytes of MAD data) and `emit` (reserved bits zero).
macro_rules! cm_message {
    ($(#[$doc:meta])* $name:ident = $attr:expr, {
        $($(#[$fdoc:meta])* $field:ident: $ty:ty = ($byte:expr, $bit:expr, $width:expr),)*
    } bytes {
        $($(#[$bdoc:meta])* $bfield:ident: $blen:expr => $boff:expr,)*
    }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct $name {
            $($(#[$fdoc])* pub $field: $ty,)*
            $($(#[$bdoc])* pub $bfield: [u8; $blen],)*
        }

        impl Default for $name {
            fn default() -> Self {
                $name { $($field: 0,)* $($bfield: [0; $blen],)* }
            }
        }

        impl $name {
            /// The MAD attribute ID of this message.
            pub const ATTRIBUTE_ID: u16 = $attr;

            /// Parses the message from the MAD's data (at least 232 bytes).
            pub fn parse(d: &[u8]) -> Result<Self, WireError> {
                if d.len() < CM_DATA_LEN {
                    return Err(WireError::Truncated { needed: CM_DATA_LEN, len: d.len() });
                }
                let mut m = $name::default();
                $(m.$field = Field { byte: $byte, bit: $bit, width: $width }.get(d) as $ty;)*
                $(m.$bfield.copy_from_slice(&d[$boff..$boff + $blen]);)*
                Ok(m)
            }

            /// Writes the message into the MAD's data (at least 232 bytes); reserved bits are
            /// zero.
            pub fn emit(&self, d: &mut [u8]) -> Result<(), WireError> {
                if d.len() < CM_DATA_LEN {
                    return Err(WireError::Truncated { needed: CM_DATA_LEN, len: d.len() });
                }
                d[..CM_DATA_LEN].fill(0);
                $(Field { byte: $byte, bit: $bit, width: $width }.set(d, u64::from(self.$field));)*
                $(d[$boff..$boff + $blen].copy_from_slice(&self.$bfield);)*
                Ok(())
            }
        }
    };
}

cm_message! {
    /// Connect Request (IBA 12.6.5, Table 106).
    CmReq = 0x0010, {
        local_comm_id: u32 = (0, 0, 32),
        service_id: u64 = (8, 0, 64),
        local_ca_guid: u64 = (16, 0, 64),
        local_qkey: u32 = (28, 0, 32),
        local_qpn: u32 = (32, 0, 24),
        responder_resources: u8 = (35, 0, 8),
        local_eecn: u32 = (36, 0, 24),
        initiator_depth: u8 = (39, 0, 8),
        remote_eecn: u32 = (40, 0, 24),
        remote_cm_response_timeout: u8 = (43, 0, 5),
        /// 0 RC, 1 UC, 2 RD, 3 extended (XRC).
        transport_service_type: u8 = (43, 5, 2),
        end_to_end_flow_control: u8 = (43, 7, 1),
        starting_psn: u32 = (44, 0, 24),
        local_cm_response_timeout: u8 = (47, 0, 5),
        retry_count: u8 = (47, 5, 3),
        partition_key: u16 = (48, 0, 16),
        path_mtu: u8 = (50, 0, 4),
        rdc_exists: u8 = (50, 4, 1),
        rnr_retry_count: u8 = (50, 5, 3),
        max_cm_retries: u8 = (51, 0, 4),
        srq: u8 = (51, 4, 1),
        extended_transport_type: u8 = (51, 5, 3),
        primary_local_lid: u16 = (52, 0, 16),
        primary_remote_lid: u16 = (54, 0, 16),
        primary_flow_label: u32 = (88, 0, 20),
        primary_packet_rate: u8 = (91, 2, 6),
        primary_traffic_class: u8 = (92, 0, 8),
        primary_hop_limit: u8 = (93, 0, 8),
        primary_sl: u8 = (94, 0, 4),
        primary_subnet_local: u8 = (94, 4, 1),
        primary_local_ack_timeout: u8 = (95, 0, 5),
        alternate_local_lid: u16 = (96, 0, 16),
        alternate_remote_lid: u16 = (98, 0, 16),
        alternate_flow_label: u32 = (132, 0, 20),
        alternate_packet_rate: u8 = (135, 2, 6),
        alternate_traffic_class: u8 = (136, 0, 8),
        alternate_hop_limit: u8 = (137, 0, 8),
        alternate_sl: u8 = (138, 0, 4),
        alternate_subnet_local: u8 = (138, 4, 1),
        alternate_local_ack_timeout: u8 = (139, 0, 5),
        sap_supported: u8 = (139, 5, 1),
    } bytes {
        primary_local_gid: 16 => 56,
        primary_remote_gid: 16 => 72,
        alternate_local_gid: 16 => 100,
        alternate_remote_gid: 16 => 116,
        private_data: 92 => 140,
    }
}

cm_message! {
    /// Message Receipt Acknowledgement (Table 107): more time wanted for `message_mraed`
    /// (0 REQ, 1 REP, 2 LAP).
    CmMra = 0x0011, {
        local_comm_id: u32 = (0, 0, 32),
        remote_comm_id: u32 = (4, 0, 32),
        message_mraed: u8 = (8, 0, 2),
        service_timeout: u8 = (9, 0, 5),
    } bytes {
        private_data: 222 => 10,
    }
}

cm_message! {
    /// Reject (Table 108): `message_rejected` 0 REQ, 1 REP, 2 other; `reason` Table 109.
    CmRej = 0x0012, {
        local_comm_id: u32 = (0, 0, 32),
        remote_comm_id: u32 = (4, 0, 32),
        message_rejected: u8 = (8, 0, 2),
        rejected_info_length: u8 = (9, 0, 7),
        reason: u16 = (10, 0, 16),
    } bytes {
        /// Additional Rejection Information.
        ari: 72 => 12,
        private_data: 148 => 84,
    }
}

cm_message! {
    /// Reply to a REQ (Table 110).
    CmRep = 0x0013, {
        local_comm_id: u32 = (0, 0, 32),
        remote_comm_id: u32 = (4, 0, 32),
        local_qkey: u32 = (8, 0, 32),
        local_qpn: u32 = (12, 0, 24),
        local_eecn: u32 = (16, 0, 24),
        starting_psn: u32 = (20, 0, 24),
        responder_resources: u8 = (24, 0, 8),
        initiator_depth: u8 = (25, 0, 8),
        target_ack_delay: u8 = (26, 0, 5),
        failover_accepted: u8 = (26, 5, 2),
        end_to_end_flow_control: u8 = (26, 7, 1),
        rnr_retry_count: u8 = (27, 0, 3),
        srq: u8 = (27, 3, 1),
        local_ca_guid: u64 = (28, 0, 64),
    } bytes {
        private_data: 196 => 36,
    }
}

cm_message! {
    /// Ready To Use (Table 111).
    CmRtu = 0x0014, {
        local_comm_id: u32 = (0, 0, 32),
        remote_comm_id: u32 = (4, 0, 32),
    } bytes {
        private_data: 224 => 8,
    }
}

cm_message! {
    /// Disconnect Request (Table 112).
    CmDreq = 0x0015, {
        local_comm_id: u32 = (0, 0, 32),
        remote_comm_id: u32 = (4, 0, 32),
        remote_qpn_eecn: u32 = (8, 0, 24),
    } bytes {
        private_data: 220 => 12,
    }
}

cm_message! {
    /// Disconnect Reply (Table 113).
    CmDrep = 0x0016, {
        local_comm_id: u32 = (0, 0, 32),
        remote_comm_id: u32 = (4, 0, 32),
    } bytes {
        private_data: 224 => 8,
    }
}

cm_message! {
    /// Service ID Resolution Request (Table 119), for UD services.
    CmSidrReq = 0x0017, {
        request_id: u32 = (0, 0, 32),
        partition_key: u16 = (4, 0, 16),
        service_id: u64 = (8, 0, 64),
    } bytes {
        private_data: 216 => 16,
    }
}

cm_message! {
    /// Service ID Resolution Reply (Table 120).
    CmSidrRep = 0x0018, {
        request_id: u32 = (0, 0, 32),
        status: u8 = (4, 0, 8),
        additional_information_length: u8 = (5, 0, 8),
        qpn: u32 = (8, 0, 24),
        service_id: u64 = (12, 0, 64),
        qkey: u32 = (20, 0, 32),
    } bytes {
        additional_information: 72 => 24,
        private_data: 136 => 96,
    }
}

/// rdma_cm's IP header, the first 36 bytes of a REQ's (and a SIDR REQ's) private data:
/// its version (0), the IP version in the high nibble of byte 1, the source port, and the
/// source and destination addresses (an IPv4 one in the last 4 bytes of its 16). The service ID
/// carries the port space and the destination port; this says which addresses the connection
/// is between, as the rdma_cm on the other side (Linux's included) reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmaHeader {
    pub src_port: u16,
    pub src: std::net::IpAddr,
    pub dst: std::net::IpAddr,
}

impl CmaHeader {
    pub const LEN: usize = 36;

    /// The header at the start of `private_data`; `None` for another version or IP version.
    pub fn parse(private_data: &[u8]) -> Option<CmaHeader> {
        let d = private_data.get(..Self::LEN)?;
        if d[0] != 0 {
            return None;
        }
        let addr = |at: usize| -> Option<std::net::IpAddr> {
            let b: [u8; 16] = d[at..at + 16].try_into().ok()?;
            match d[1] >> 4 {
                4 => Some(std::net::Ipv4Addr::new(b[12], b[13], b[14], b[15]).into()),
                6 => Some(std::net::Ipv6Addr::from(b).into()),
                _ => None,
            }
        };
        Some(CmaHeader { src_port: u16_at(d, 2), src: addr(4)?, dst: addr(20)? })
    }

    /// Writes the header at the start of `private_data` (both addresses must be of one IP
    /// version).
    pub fn emit(&self, private_data: &mut [u8]) -> Result<(), WireError> {
        let len = private_data.len();
        let d = private_data.get_mut(..Self::LEN).ok_or(WireError::Truncated { needed: Self::LEN, len })?;
        d.fill(0);
        let mut put = |at: usize, a: std::net::IpAddr| match a {
            std::net::IpAddr::V4(v4) => d[at + 12..at + 16].copy_from_slice(&v4.octets()),
            std::net::IpAddr::V6(v6) => d[at..at + 16].copy_from_slice(&v6.octets()),
        };
        put(4, self.src);
        put(20, self.dst);
        d[1] = match (self.src, self.dst) {
            (std::net::IpAddr::V4(_), std::net::IpAddr::V4(_)) => 4 << 4,
            (std::net::IpAddr::V6(_), std::net::IpAddr::V6(_)) => 6 << 4,
            _ => return Err(WireError::BadLength),
        };
        set_u16(d, 2, self.src_port);
        Ok(())
    }
}

/// The CM messages by kind, listed once: the enum, its parse by attribute ID, and emit.
macro_rules! cm_messages {
    ($($kind:ident($msg:ident),)*) => {
        /// A CM message of any kind.
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub enum CmMessage {
            $($kind(Box<$msg>),)*
        }

        impl CmMessage {
            /// The CM message of a MAD of the CM class; `Err` for another class or an
            /// attribute the CM does not define (the caller drops it).
            pub fn parse(mad: &[u8]) -> Result<(MadHeaderRepr, CmMessage), WireError> {
                let (h, d) = MadHeaderRepr::parse(mad)?;
                if h.mgmt_class != MGMT_CLASS_CM {
                    return Err(WireError::BadLength);
                }
                let m = match h.attribute_id {
                    $($msg::ATTRIBUTE_ID => CmMessage::$kind(Box::new($msg::parse(d)?)),)*
                    _ => return Err(WireError::BadLength),
                };
                Ok((h, m))
            }

            /// The message's attribute ID.
            pub fn attribute_id(&self) -> u16 {
                match self {
                    $(CmMessage::$kind(_) => $msg::ATTRIBUTE_ID,)*
                }
            }

            /// Writes the whole MAD (header with `header`'s fields, the attribute ID this
            /// message's).
            pub fn emit(&self, header: &MadHeaderRepr, mad: &mut [u8]) -> Result<(), WireError> {
                if mad.len() < MAD_LEN {
                    return Err(WireError::Truncated { needed: MAD_LEN, len: mad.len() });
                }
                MadHeaderRepr { attribute_id: self.attribute_id(), ..*header }.emit(mad)?;
                let d = &mut mad[MAD_HEADER_LEN..MAD_LEN];
                match self {
                    $(CmMessage::$kind(m) => m.emit(d),)*
                }
            }
        }
    };
}

cm_messages! {
    Req(CmReq),
    Mra(CmMra),
    Rej(CmRej),
    Rep(CmRep),
    Rtu(CmRtu),
    Dreq(CmDreq),
    Drep(CmDrep),
    SidrReq(CmSidrReq),
    SidrRep(CmSidrRep),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_read_and_write_msb_first_across_bytes() {
        let mut d = [0u8; 8];
        let f = Field { byte: 1, bit: 2, width: 6 };
        f.set(&mut d, 0x3F);
        assert_eq!(d[1], 0x3F);
        let g = Field { byte: 2, bit: 0, width: 20 };
        g.set(&mut d, 0xABCDE);
        assert_eq!(&d[2..5], &[0xAB, 0xCD, 0xE0]);
        assert_eq!((f.get(&d), g.get(&d)), (0x3F, 0xABCDE));
        g.set(&mut d, 0x1_FFFFF); // wider than the field: only 20 bits land
        assert_eq!(&d[2..5], &[0xFF, 0xFF, 0xF0]);
        let w = Field { byte: 0, bit: 0, width: 64 };
        w.set(&mut d, 0x0102_0304_0506_0708);
        assert_eq!(w.get(&d), 0x0102_0304_0506_0708);
    }

    #[test]
    fn short_buffers_are_errors_not_panics() {
        assert!(MadHeaderRepr::parse(&[0; 255]).is_err());
        assert!(CmReq::parse(&[0; 231]).is_err());
        assert!(CmRtu::default().emit(&mut [0; 10]).is_err());
        assert!(CmMessage::parse(&[0xFF; 256]).is_err());
    }
}
