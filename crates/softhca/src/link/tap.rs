//! Middleware on a link's datagram path, as smoltcp's `phy` wrappers are on a device's: a
//! [`Tap`] sees every datagram a link sends, as it left, and every datagram arriving for the
//! device, before the device does, and may record it ([`PcapTap`]) or decide its fate
//! ([`Faults`]: seeded loss and duplication). Any link takes a chain of them: the UDP link
//! ([`crate::link::udp::UdpConfig::tap`]) and the sim fabric ([`crate::link::SimFabric::add_tap`]);
//! a tap knows nothing of the link it is on.
//!
//! A tap never changes a datagram: a link may hand it one whose ICRC it has already checked.
//! Corruption is the sim fabric's own fault model (it delivers before any check).

use std::fmt;
use std::io::{self, Write};
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::pcap::{PcapTap, UNKNOWN_MAC};
use crate::wire::roce::Ipv4Header;

/// What becomes of an arriving datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    Deliver,
    /// Lost on the way: the device never sees it.
    Drop,
    /// Duplicated on the way: the device sees it twice.
    Twice,
}

/// Middleware on a link's datagram path.
pub trait Tap: Send {
    /// A datagram the link put on the wire, as it left (IP header on, ICRC included).
    fn sent(&mut self, _now_ns: u64, _datagram: &[u8]) {}
    /// A datagram arriving for the device, before the device sees it.
    fn arriving(&mut self, _now_ns: u64, _datagram: &[u8]) -> Fate {
        Fate::Deliver
    }
    /// Writes out what the tap buffers (the link calls it when it closes).
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A tap a link configuration holds; clones share the tap, so a test keeps a handle to what
/// it gave a link.
#[derive(Clone)]
pub struct TapHandle(Arc<Mutex<dyn Tap>>);

impl TapHandle {
    pub fn new(tap: impl Tap + 'static) -> TapHandle {
        TapHandle(Arc::new(Mutex::new(tap)))
    }

    fn with<R>(&self, f: impl FnOnce(&mut dyn Tap) -> R) -> R {
        f(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl fmt::Debug for TapHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TapHandle")
    }
}

/// A link's taps, in the order they were added: each sees what the ones before it let through.
#[derive(Debug, Clone, Default)]
pub struct Taps(pub(crate) Vec<TapHandle>);

impl Taps {
    pub fn push(&mut self, tap: TapHandle) {
        self.0.push(tap);
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn sent(&self, now_ns: u64, datagram: &[u8]) {
        for t in &self.0 {
            t.with(|t| t.sent(now_ns, datagram));
        }
    }

    /// The fate of an arriving datagram: the first tap that does not deliver it decides; a
    /// duplicate is seen twice by the taps after the one that made it.
    pub fn arriving(&self, now_ns: u64, datagram: &[u8]) -> Fate {
        self.arriving_from(0, now_ns, datagram)
    }

    fn arriving_from(&self, first: usize, now_ns: u64, datagram: &[u8]) -> Fate {
        for (i, t) in self.0.iter().enumerate().skip(first) {
            match t.with(|t| t.arriving(now_ns, datagram)) {
                Fate::Deliver => {}
                Fate::Drop => return Fate::Drop,
                Fate::Twice => {
                    // Each copy goes on through the rest of the chain.
                    let a = self.arriving_from(i + 1, now_ns, datagram);
                    let b = self.arriving_from(i + 1, now_ns, datagram);
                    return match (a, b) {
                        (Fate::Drop, Fate::Drop) => Fate::Drop,
                        (Fate::Drop, _) | (_, Fate::Drop) => Fate::Deliver,
                        _ => Fate::Twice,
                    };
                }
            }
        }
        Fate::Deliver
    }

    /// How many copies of an arriving datagram the device gets (0, 1 or 2): 1 with no taps.
    pub fn copies_arriving(&self, now_ns: u64, datagram: &[u8]) -> usize {
        if self.is_empty() {
            return 1;
        }
        match self.arriving(now_ns, datagram) {
            Fate::Deliver => 1,
            Fate::Drop => 0,
            Fate::Twice => 2,
        }
    }

    pub fn flush(&self) {
        for t in &self.0 {
            let _ = t.with(|t| t.flush());
        }
    }
}

/// The MACs (source, destination) a capture shows for a datagram: 02:00 followed by the IPv4
/// address; IPv6 (and anything else) gets [`UNKNOWN_MAC`].
pub fn macs_of(d: &[u8]) -> ([u8; 6], [u8; 6]) {
    let mac = |a: Ipv4Addr| {
        let o = a.octets();
        [0x02, 0, o[0], o[1], o[2], o[3]]
    };
    match Ipv4Header::new_checked(d) {
        Ok(h) if d[0] >> 4 == 4 => (mac(h.src_addr()), mac(h.dst_addr())),
        _ => (UNKNOWN_MAC, UNKNOWN_MAC),
    }
}

/// A pcap capture as a tap: every datagram sent and every datagram arriving (before the taps
/// after it decide its fate), with MACs from [`macs_of`].
impl<W: Write + Send> Tap for PcapTap<W> {
    fn sent(&mut self, now_ns: u64, datagram: &[u8]) {
        let (src, dst) = macs_of(datagram);
        let _ = self.write_datagram(now_ns, src, dst, datagram);
    }

    fn arriving(&mut self, now_ns: u64, datagram: &[u8]) -> Fate {
        let (src, dst) = macs_of(datagram);
        let _ = self.write_datagram(now_ns, src, dst, datagram);
        Fate::Deliver
    }

    fn flush(&mut self) -> io::Result<()> {
        PcapTap::flush(self)
    }
}

/// Seeded faults on arrival: each datagram is lost with probability `loss`, else duplicated
/// with probability `dup`. On a real link this is what `tc netem` does without privileges,
/// for one device's receive side; the transport's retries and duplicate handling do the rest.
#[derive(Debug)]
pub struct Faults {
    rng: StdRng,
    loss: f64,
    dup: f64,
    counts: Arc<FaultCounts>,
}

/// How many datagrams a [`Faults`] tap dropped and duplicated.
#[derive(Debug, Default)]
pub struct FaultCounts {
    pub dropped: std::sync::atomic::AtomicU64,
    pub duplicated: std::sync::atomic::AtomicU64,
}

impl Faults {
    pub fn new(seed: u64) -> Faults {
        Faults { rng: StdRng::seed_from_u64(seed), loss: 0.0, dup: 0.0, counts: Arc::default() }
    }

    pub fn loss(mut self, p: f64) -> Faults {
        self.loss = p.clamp(0.0, 1.0);
        self
    }

    pub fn dup(mut self, p: f64) -> Faults {
        self.dup = p.clamp(0.0, 1.0);
        self
    }

    /// The tap's counts, readable while a link owns the tap.
    pub fn counts(&self) -> Arc<FaultCounts> {
        self.counts.clone()
    }
}

impl Tap for Faults {
    fn arriving(&mut self, _now_ns: u64, _datagram: &[u8]) -> Fate {
        use std::sync::atomic::Ordering::Relaxed;
        if self.loss > 0.0 && self.rng.random::<f64>() < self.loss {
            self.counts.dropped.fetch_add(1, Relaxed);
            Fate::Drop
        } else if self.dup > 0.0 && self.rng.random::<f64>() < self.dup {
            self.counts.duplicated.fetch_add(1, Relaxed);
            Fate::Twice
        } else {
            Fate::Deliver
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Count(Arc<Mutex<(u32, u32)>>);

    impl Tap for Count {
        fn sent(&mut self, _: u64, _: &[u8]) {
            self.0.lock().unwrap().0 += 1;
        }
        fn arriving(&mut self, _: u64, _: &[u8]) -> Fate {
            self.0.lock().unwrap().1 += 1;
            Fate::Deliver
        }
    }

    /// A duplicate made by one tap is seen twice by the taps after it, once by those before;
    /// a drop stops the chain; the seeded faults repeat for a seed.
    #[test]
    fn a_chain_decides_in_order() {
        let seen = Arc::new(Mutex::new((0, 0)));
        let mut taps = Taps::default();
        taps.push(TapHandle::new(Count(seen.clone())));
        taps.push(TapHandle::new(Faults::new(1).dup(1.0)));
        let after = Arc::new(Mutex::new((0, 0)));
        taps.push(TapHandle::new(Count(after.clone())));
        assert_eq!(taps.arriving(0, b"x"), Fate::Twice);
        taps.sent(0, b"x");
        assert_eq!(*seen.lock().unwrap(), (1, 1));
        assert_eq!(*after.lock().unwrap(), (1, 2));
        let mut lossy = Taps::default();
        lossy.push(TapHandle::new(Faults::new(1).loss(1.0)));
        lossy.push(TapHandle::new(Count(after.clone())));
        assert_eq!(lossy.arriving(0, b"x"), Fate::Drop);
        assert_eq!(after.lock().unwrap().1, 2, "nothing after a drop sees it");
        let draw = |seed| {
            let mut f = Faults::new(seed).loss(0.3).dup(0.3);
            (0..64).map(|_| f.arriving(0, b"")).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
    }
}
