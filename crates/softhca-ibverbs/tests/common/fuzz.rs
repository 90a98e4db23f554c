//! What the C ABI fuzz harnesses share (`rdmacm_fuzz.rs`, `rsocket_fuzz.rs`): the run's seed
//! and length, a seeded generator, a hang guard and the calling thread's errno.

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The run's seed and number of calls: `SOFTHCA_FUZZ_SEED` (hex) and `SOFTHCA_FUZZ_ITERS`,
/// else the harness's defaults.
pub fn run_params(default_seed: u64, default_iters: u64) -> (u64, u64) {
    let seed =
        std::env::var("SOFTHCA_FUZZ_SEED").ok().and_then(|v| u64::from_str_radix(v.trim_start_matches("0x"), 16).ok());
    let iters = std::env::var("SOFTHCA_FUZZ_ITERS").ok().and_then(|v| v.parse().ok());
    (seed.unwrap_or(default_seed), iters.unwrap_or(default_iters))
}

/// A hang guard only: unless it is dropped within 120 s, the process aborts, saying which
/// harness and seed hung, so that a hang fails the test instead of stalling the suite.
pub struct Watchdog(Arc<AtomicBool>);

impl Watchdog {
    pub fn start(harness: &'static str, seed: u64) -> Watchdog {
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(120));
            if !d.load(Ordering::SeqCst) {
                eprintln!("{harness}: hung (SOFTHCA_FUZZ_SEED={seed:#x})");
                std::process::abort();
            }
        });
        Watchdog(done)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// splitmix64: every run of a seed makes the same calls.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub fn pick<T: Copy>(&mut self, v: &[T]) -> Option<T> {
        (!v.is_empty()).then(|| v[self.below(v.len() as u64) as usize])
    }
}

pub fn errno() -> c_int {
    // SAFETY: the calling thread's errno.
    unsafe { *libc::__errno_location() }
}
