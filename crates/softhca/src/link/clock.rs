//! The OS-facing links' clock: nanoseconds since a link started, read at every engine turn,
//! every busy poll and every doorbell.
//!
//! Natively that is `clock_gettime(CLOCK_MONOTONIC)` through the vDSO, ~20 ns. Where the
//! kernel's clocksource cannot be read from user space the same call is a system call that
//! reads the clock device: in the rxe-vm guest (qemu TCG, which the kernel gives the HPET
//! after it finds the emulated TSCs "unsynchronized") it costs 0.8 µs alone and 1.4 µs while
//! the other vCPU reads it too (the emulated HPET sits behind qemu's global lock), and a
//! busy-poll ping-pong read it several times per hop. There the clock counts the TSC instead
//! (10–25 ns in that guest), scaled to nanoseconds by comparing it with the kernel's clock over
//! the first [`CALIBRATION`] (the kernel's clock serves until then). qemu's TSC is the host's,
//! so it is steady and agrees between vCPUs (measured within the 0.8 µs a comparison can
//! resolve there); a TSC that stood still or ran implausibly fast disqualifies itself and the
//! kernel's clock stays.
//!
//! Which source is used is decided once per process: by timing a few reads of the kernel's
//! clock ([`SLOW_READ`]), or as `SOFTHCA_CLOCK=kernel` or `=tsc` says. Nothing else changes:
//! the engine's timers, the driver's grace periods and the taps' stamps all take their time
//! from here. The TSC is trusted where the kernel distrusts it, which is right under qemu and
//! wrong on hardware whose TSCs really differ between sockets or stop in deep idle: there a
//! thread ahead may see a timer due early (a needless retransmission) and a stopped TSC delays
//! timers. Such a machine is rare (its kernel also falls back to a slow clock) and should set
//! `SOFTHCA_CLOCK=kernel`.
//!
//! Imports: std and `libc` only.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A kernel clock read slower than this (the median of a few) is a system call, and the TSC
/// is counted instead where there is one. The vDSO's read takes ~20 ns on this machine,
/// a system call at least ~100 ns natively and ~800 ns under TCG.
const SLOW_READ: Duration = Duration::from_nanos(250);
/// How long the TSC is compared with the kernel's clock before it is trusted: long enough that
/// two reads' uncertainty (~1.4 µs at worst under TCG) is < 0.01% of it.
const CALIBRATION: Duration = Duration::from_millis(20);
/// The TSC rates taken for plausible, in ticks per nanosecond: outside them the calibration
/// is discarded and the kernel's clock stays.
const PLAUSIBLE_GHZ: std::ops::RangeInclusive<f64> = 0.05..=20.0;

/// A link's clock: nanoseconds since [`Clock::start`]. Cheap to copy; every copy reads the
/// same process-wide source.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Clock {
    start: u64,
}

impl Clock {
    /// Starts a clock at 0 now.
    pub fn start() -> Clock {
        Clock { start: source().now() }
    }

    /// Nanoseconds since the start. Counting the TSC, reads on different CPUs (and a thread's
    /// reads across a move between CPUs) may disagree by as much as the CPUs' TSCs do (see
    /// the module docs); every use subtracts with saturation.
    #[inline]
    pub fn now(&self) -> u64 {
        source().now().saturating_sub(self.start)
    }
}

/// Whether this process counts the TSC: its kernel clock is a system call, the mark of an
/// emulated machine (qemu TCG), where every wait worth guessing is tens of times longer.
pub(crate) fn counts_tsc() -> bool {
    matches!(source(), Source::Tsc(_))
}

/// A guessed wait in ns for this host: `native`, or `emulated` where this process counts the
/// TSC ([`counts_tsc`]).
pub(crate) fn on_this_host(native: u64, emulated: u64) -> u64 {
    if counts_tsc() {
        emulated
    } else {
        native
    }
}

/// The process-wide source, chosen at first use.
fn source() -> &'static Source {
    static SOURCE: OnceLock<Source> = OnceLock::new();
    SOURCE.get_or_init(Source::choose)
}

/// Where time comes from.
#[derive(Debug)]
enum Source {
    /// `clock_gettime(CLOCK_MONOTONIC)` (through `Instant`), since the source was chosen.
    Kernel(Instant),
    /// The TSC, once calibrated; the kernel's clock before.
    Tsc(Tsc),
}

impl Source {
    #[cold]
    fn choose() -> Source {
        let origin = Instant::now();
        let wanted = std::env::var("SOFTHCA_CLOCK").ok();
        let tsc = match wanted.as_deref().map(str::trim) {
            Some("kernel") => false,
            Some("tsc") => true,
            _ => kernel_read_cost(origin) > SLOW_READ,
        };
        let source = match tsc.then(|| Tsc::begin(origin)).flatten() {
            Some(t) => Source::Tsc(t),
            None => Source::Kernel(origin),
        };
        tracing::debug!(?source, "link clock");
        source
    }

    #[inline]
    fn now(&self) -> u64 {
        match self {
            Source::Kernel(origin) => kernel_ns(*origin),
            Source::Tsc(t) => t.now(),
        }
    }
}

/// Nanoseconds of the kernel's monotonic clock since `origin`.
#[inline]
fn kernel_ns(origin: Instant) -> u64 {
    origin.elapsed().as_nanos() as u64
}

/// The median cost of one kernel clock read, from nine.
fn kernel_read_cost(origin: Instant) -> Duration {
    let mut d = [0u64; 9];
    let mut last = kernel_ns(origin);
    for cost in &mut d {
        let t = kernel_ns(origin);
        *cost = t.saturating_sub(last);
        last = t;
    }
    d.sort_unstable();
    Duration::from_nanos(d[d.len() / 2])
}

/// The TSC as a clock: counted from a pair of readings (TSC, kernel ns) taken together, at a
/// rate measured between two such pairs [`CALIBRATION`] apart.
#[derive(Debug)]
struct Tsc {
    origin: Instant,
    began: Reading,
    scale: OnceLock<Scale>,
}

/// A TSC value and the kernel's time (ns since the origin) read right after it.
#[derive(Clone, Copy, Debug)]
struct Reading {
    tsc: u64,
    ns: u64,
}

/// TSC ticks to nanoseconds: `ns = at.ns + (tsc - at.tsc) * mult >> 32`.
#[derive(Clone, Copy, Debug)]
struct Scale {
    at: Reading,
    mult: u64,
}

impl Scale {
    /// The scale from `began` to `at`, counted from `at`; None where the TSC did not move at a
    /// plausible rate ([`PLAUSIBLE_GHZ`]).
    fn between(began: Reading, at: Reading) -> Option<Scale> {
        let ticks = at.tsc.checked_sub(began.tsc)?;
        let ns = at.ns.checked_sub(began.ns)?;
        if ns == 0 || !PLAUSIBLE_GHZ.contains(&(ticks as f64 / ns as f64)) {
            return None;
        }
        let mult = u64::try_from((u128::from(ns) << 32) / u128::from(ticks)).ok()?;
        Some(Scale { at, mult })
    }

    /// The time at `tsc`. A TSC behind the calibration's (another CPU's, a hair behind)
    /// counts as the calibration's own moment.
    #[inline]
    fn ns(&self, tsc: u64) -> u64 {
        let ticks = tsc.saturating_sub(self.at.tsc);
        self.at.ns + ((u128::from(ticks) * u128::from(self.mult)) >> 32) as u64
    }
}

impl Tsc {
    /// A TSC clock, if this process may read the TSC.
    fn begin(origin: Instant) -> Option<Tsc> {
        let began = read_pair(origin)?;
        Some(Tsc { origin, began, scale: OnceLock::new() })
    }

    #[inline]
    fn now(&self) -> u64 {
        if let Some(s) = self.scale.get() {
            // `read_pair` proved the TSC readable before this was set.
            return s.ns(rdtsc().unwrap_or(0));
        }
        self.calibrating()
    }

    /// Until [`CALIBRATION`] has passed: the kernel's clock; then the first reader to see it
    /// has passed sets the scale (a racing reader's is dropped: both are as good). The TSC
    /// is read before the kernel's clock, so the TSC clock starts a read's cost ahead of the
    /// kernel's and never steps back from what a reader saw before.
    #[cold]
    fn calibrating(&self) -> u64 {
        let Some(at) = read_pair(self.origin) else { return kernel_ns(self.origin) };
        if at.ns.saturating_sub(self.began.ns) >= CALIBRATION.as_nanos() as u64 {
            match Scale::between(self.began, at) {
                Some(s) => {
                    let _ = self.scale.set(s);
                }
                // An implausible TSC: the kernel's clock serves, and each later read tries
                // the rate again (from the same first reading).
                None => tracing::debug!(?at, began = ?self.began, "TSC rate implausible"),
            }
        }
        at.ns
    }
}

/// The TSC and then the kernel's clock.
fn read_pair(origin: Instant) -> Option<Reading> {
    let tsc = rdtsc()?;
    Some(Reading { tsc, ns: kernel_ns(origin) })
}

/// The time-stamp counter, where the CPU has one and the process may read it (Linux can make
/// RDTSC fault per process: `PR_SET_TSC`).
#[cfg(target_arch = "x86_64")]
#[inline]
fn rdtsc() -> Option<u64> {
    static ALLOWED: OnceLock<bool> = OnceLock::new();
    let allowed = *ALLOWED.get_or_init(|| {
        let mut mode: libc::c_int = 0;
        // SAFETY: PR_GET_TSC writes one int through the pointer, which points at `mode`.
        let r = unsafe { libc::prctl(libc::PR_GET_TSC, &mut mode as *mut libc::c_int) };
        r == 0 && mode == libc::PR_TSC_ENABLE
    });
    // SAFETY: every x86_64 CPU has RDTSC; it reads a register and touches no memory, and the
    // check above makes sure the kernel lets this process execute it.
    allowed.then(|| unsafe { std::arch::x86_64::_rdtsc() })
}

#[cfg(not(target_arch = "x86_64"))]
#[inline]
fn rdtsc() -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_counts_nanoseconds_from_the_later_reading() {
        // 2.5 ticks per ns, calibrated over 20 ms.
        let began = Reading { tsc: 1_000, ns: 0 };
        let at = Reading { tsc: 1_000 + 50_000_000, ns: 20_000_000 };
        let s = Scale::between(began, at).unwrap();
        assert_eq!(s.ns(at.tsc), at.ns);
        let one_second_later = s.ns(at.tsc + 2_500_000_000);
        assert!(one_second_later.abs_diff(at.ns + 1_000_000_000) <= 1, "{one_second_later}");
        // A TSC a hair behind the calibration's (another CPU) is the calibration's moment.
        assert_eq!(s.ns(at.tsc - 10), at.ns);
    }

    #[test]
    fn an_implausible_tsc_is_not_trusted() {
        let began = Reading { tsc: 1_000, ns: 0 };
        // Stood still, ran backwards, or 100 GHz.
        assert!(Scale::between(began, Reading { tsc: 1_000, ns: 20_000_000 }).is_none());
        assert!(Scale::between(began, Reading { tsc: 10, ns: 20_000_000 }).is_none());
        assert!(Scale::between(began, Reading { tsc: 2_000_000_001_000, ns: 20_000_000 }).is_none());
        // No time passed.
        assert!(Scale::between(began, Reading { tsc: 5_000, ns: 0 }).is_none());
    }

    /// The TSC clock through its calibration: never steps back, and comes out counting.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_tsc_clock_never_steps_back_across_its_calibration() {
        let Some(t) = Tsc::begin(Instant::now()) else { return };
        let mut last = 0;
        while t.scale.get().is_none() {
            let n = t.now();
            assert!(n >= last, "{n} after {last}");
            last = n;
            std::thread::yield_now();
        }
        for _ in 0..1000 {
            let n = t.now();
            assert!(n >= last, "{n} after {last}");
            last = n;
        }
        assert!(last >= CALIBRATION.as_nanos() as u64);
    }
}
