//! ACK Extended Transport Header (4 bytes), PKT-HDR-1: byte 0 Syndrome,
//! bytes 1-3 MSN. The syndrome encoding is PKT-ACK-1; the credit and RNR timer
//! tables are from RULES.md "Acknowledgements" and "RNR" (PKT-RNR-6).

use core::time::Duration;

use super::field::{set_u24, u24_at};
use super::{header_view, WireError};

header_view!(
    /// A view over an AETH.
    Aeth, 4
);

impl<T: AsRef<[u8]>> Aeth<T> {
    /// The raw syndrome byte.
    pub fn syndrome_byte(&self) -> u8 {
        self.buffer.as_ref()[0]
    }

    pub fn syndrome(&self) -> Syndrome {
        Syndrome::from_byte(self.syndrome_byte())
    }

    /// Message Sequence Number (24 bits), PKT-ACK-9.
    pub fn msn(&self) -> u32 {
        u24_at(self.buffer.as_ref(), 1)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Aeth<T> {
    pub fn set_syndrome(&mut self, s: Syndrome) {
        self.buffer.as_mut()[0] = s.to_byte();
    }

    /// Only the low 24 bits of `v` fit.
    pub fn set_msn(&mut self, v: u32) {
        set_u24(self.buffer.as_mut(), 1, v);
    }
}

/// NAK codes (syndrome type 11).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// 0x60.
    PsnSeqErr,
    /// 0x61.
    InvalidRequest,
    /// 0x62.
    RemoteAccessError,
    /// 0x63.
    RemoteOperationalError,
    /// 0x64.
    InvalidRdRequest,
}

/// NAK codes by their value in bits 4:0.
const NAK_CODES: [NakCode; 5] = [
    NakCode::PsnSeqErr,
    NakCode::InvalidRequest,
    NakCode::RemoteAccessError,
    NakCode::RemoteOperationalError,
    NakCode::InvalidRdRequest,
];

impl NakCode {
    /// The value in syndrome bits 4:0.
    pub const fn value(self) -> u8 {
        self as u8
    }
}

/// A decoded AETH syndrome (PKT-ACK-1). Reserved values stay values: a
/// reserved syndrome is not an error of the wire layer, the requester decides
/// what it means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// ACK; `credit_code` is 0..=31, 31 meaning "no credit information".
    Ack {
        credit_code: u8,
    },
    /// RNR NAK; `timer_code` is 0..=31 (see [`rnr_timer_us`]).
    RnrNak {
        timer_code: u8,
    },
    Nak(NakCode),
    /// 0x40-0x5F, 0x65-0x7F and 0x80-0xFF.
    Reserved(u8),
}

impl Syndrome {
    /// An ACK carrying no credit information (code 31).
    pub const ACK_NO_CREDITS: Syndrome = Syndrome::Ack { credit_code: CREDIT_CODE_INVALID };

    /// Decodes a syndrome byte; total over all 256 values.
    pub const fn from_byte(b: u8) -> Syndrome {
        let value = b & 0x1f;
        match b >> 5 {
            0b000 => Syndrome::Ack { credit_code: value },
            0b001 => Syndrome::RnrNak { timer_code: value },
            0b011 if (value as usize) < NAK_CODES.len() => Syndrome::Nak(NAK_CODES[value as usize]),
            _ => Syndrome::Reserved(b),
        }
    }

    /// Encodes the syndrome byte. Codes wider than 5 bits are truncated to 5,
    /// since the field cannot hold more.
    pub const fn to_byte(self) -> u8 {
        match self {
            Syndrome::Ack { credit_code } => credit_code & 0x1f,
            Syndrome::RnrNak { timer_code } => 0x20 | (timer_code & 0x1f),
            Syndrome::Nak(code) => 0x60 | code.value(),
            Syndrome::Reserved(b) => b,
        }
    }

    pub const fn is_ack(self) -> bool {
        matches!(self, Syndrome::Ack { .. })
    }
}

impl From<u8> for Syndrome {
    fn from(b: u8) -> Self {
        Syndrome::from_byte(b)
    }
}

impl From<Syndrome> for u8 {
    fn from(s: Syndrome) -> u8 {
        s.to_byte()
    }
}

/// The credit count code that means "no credit information" (PKT-ACK-11 for
/// SRQs).
pub const CREDIT_CODE_INVALID: u8 = 31;

/// Credits per credit count code 0..=30 (RULES.md "Acknowledgements").
pub const CREDIT_TABLE: [u32; 31] = [
    0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144,
    8192, 12288, 16384, 24576, 32768,
];

/// The number of credits a code stands for; `None` for code 31 and for values
/// that do not fit the 5-bit field.
pub const fn credits(code: u8) -> Option<u32> {
    if (code as usize) < CREDIT_TABLE.len() {
        Some(CREDIT_TABLE[code as usize])
    } else {
        None
    }
}

/// The largest credit code whose credits do not exceed `available`
/// (PKT-ACK-11). Never 31: a responder with credits to report always has a
/// code for them.
pub const fn credit_code_for(available: u32) -> u8 {
    let mut code = CREDIT_TABLE.len() - 1;
    while code > 0 && CREDIT_TABLE[code] > available {
        code -= 1;
    }
    code as u8
}

/// RNR NAK timer per code 0..=31, in microseconds (RULES.md "RNR").
pub const RNR_TIMER_US: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840, 5_120, 7_680,
    10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840, 245_760, 327_680, 491_520,
];

/// The RNR NAK timer of a code, in microseconds (PKT-RNR-6). Only the low 5
/// bits of `code` count, as in the syndrome field.
pub const fn rnr_timer_us(code: u8) -> u32 {
    RNR_TIMER_US[(code & 0x1f) as usize]
}

/// [`rnr_timer_us`] as a `Duration`.
pub const fn rnr_timer(code: u8) -> Duration {
    Duration::from_micros(rnr_timer_us(code) as u64)
}

/// The fields of an AETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AethRepr {
    pub syndrome: Syndrome,
    /// 24 bits.
    pub msn: u32,
}

impl AethRepr {
    pub const LEN: usize = 4;

    pub fn parse<T: AsRef<[u8]>>(h: &Aeth<T>) -> Result<Self, WireError> {
        Ok(AethRepr { syndrome: h.syndrome(), msn: h.msn() })
    }

    pub const fn buffer_len(&self) -> usize {
        Self::LEN
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Aeth<T>) {
        h.set_syndrome(self.syndrome);
        h.set_msn(self.msn);
    }
}
