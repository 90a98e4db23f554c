//! Packet Sequence Numbers: 24-bit values whose arithmetic and comparisons are
//! all modulo 2^24 (PKT-PSN-1).

use core::cmp::Ordering;
use core::fmt;

/// A 24-bit Packet Sequence Number. The constructor masks to 24 bits, so a
/// `Psn` never holds a value the BTH cannot carry.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

/// How an RC responder classifies a request PSN against its ePSN (PKT-PSN-4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PsnClass {
    /// PSN = ePSN.
    Expected,
    /// PSN lies in the 2^23 PSNs before ePSN.
    Duplicate,
    /// Anything else: the PSN is ahead of ePSN (a packet was lost).
    OutOfSequence,
}

impl Psn {
    /// 2^24: the PSN space.
    pub const MODULUS: u32 = 1 << 24;
    /// Mask of the 24 significant bits.
    pub const MASK: u32 = Self::MODULUS - 1;
    /// 2^23: half the PSN space, the window that separates "before" from "after".
    pub const HALF: u32 = 1 << 23;

    /// The PSN `v mod 2^24`.
    #[inline]
    pub const fn new(v: u32) -> Self {
        Psn(v & Self::MASK)
    }

    /// The 24-bit value.
    #[inline]
    pub const fn value(self) -> u32 {
        self.0
    }

    /// `self + n (mod 2^24)`.
    #[inline]
    #[must_use]
    pub const fn add(self, n: u32) -> Self {
        Psn::new(self.0.wrapping_add(n))
    }

    /// `self - n (mod 2^24)`.
    #[inline]
    #[must_use]
    pub const fn sub(self, n: u32) -> Self {
        Psn::new(self.0.wrapping_sub(n))
    }

    /// The next PSN.
    #[inline]
    #[must_use]
    pub const fn next(self) -> Self {
        self.add(1)
    }

    /// How far `self` is ahead of `from`, walking forward: `(self - from) mod 2^24`,
    /// in `0..2^24`.
    #[inline]
    pub const fn distance_from(self, from: Psn) -> u32 {
        self.0.wrapping_sub(from.0) & Self::MASK
    }

    /// Orders two PSNs in the serial-number sense: `self` is greater than `other`
    /// when it lies in the 2^23 - 1 PSNs after it, less when it lies in the 2^23
    /// PSNs before it. Not a total order over the whole space, which is why
    /// `Psn` does not implement `Ord`.
    #[inline]
    pub const fn psn_cmp(self, other: Psn) -> Ordering {
        let d = self.distance_from(other);
        if d == 0 {
            Ordering::Equal
        } else if d < Self::HALF {
            Ordering::Greater
        } else {
            Ordering::Less
        }
    }

    /// True when `self` is one of the 2^23 PSNs just before `epsn`: a
    /// duplicate for a responder expecting `epsn` (PKT-PSN-4).
    #[inline]
    pub const fn is_before_within_window(self, epsn: Psn) -> bool {
        let back = epsn.distance_from(self);
        back >= 1 && back <= Self::HALF
    }

    /// Classifies a request PSN against the responder's ePSN (PKT-PSN-4).
    #[inline]
    pub const fn classify(self, epsn: Psn) -> PsnClass {
        if self.0 == epsn.0 {
            PsnClass::Expected
        } else if self.is_before_within_window(epsn) {
            PsnClass::Duplicate
        } else {
            PsnClass::OutOfSequence
        }
    }

    /// True when `self` lies in the inclusive range `first ..= last`, walking
    /// forward from `first` (so the range may wrap through 0). Useful to a
    /// requester checking a response against its outstanding PSNs (PKT-ACK-8).
    #[inline]
    pub const fn in_range(self, first: Psn, last: Psn) -> bool {
        self.distance_from(first) <= last.distance_from(first)
    }
}

impl From<u32> for Psn {
    fn from(v: u32) -> Self {
        Psn::new(v)
    }
}

impl From<Psn> for u32 {
    fn from(p: Psn) -> Self {
        p.0
    }
}

impl core::ops::Add<u32> for Psn {
    type Output = Psn;
    fn add(self, n: u32) -> Psn {
        Psn::add(self, n)
    }
}

impl core::ops::AddAssign<u32> for Psn {
    fn add_assign(&mut self, n: u32) {
        *self = Psn::add(*self, n);
    }
}

impl core::ops::Sub<u32> for Psn {
    type Output = Psn;
    fn sub(self, n: u32) -> Psn {
        Psn::sub(self, n)
    }
}

impl fmt::Debug for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Psn({:#08x})", self.0)
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}
