//! The CRC-32 every ICRC is made of (IEEE 802.3's polynomial, reflected), in crc32fast's
//! convention: `update(0, bytes)` is the CRC of `bytes`, and `update(update(0, a), b)` that of
//! `a` followed by `b`.
//!
//! Two ways to compute it, one chosen per process by timing both on its first use ([`update`]):
//! crc32fast, which folds 16 bytes at a time by carry-less multiplication where the CPU has
//! it, and a slicing-by-16 table walk of this module. On hardware the first wins by far (4 KiB:
//! 78 against 1,450 ns on the development machine). Under an emulator that translates
//! instructions, as qemu's TCG does for the rxe guest of the benchmarks, every PCLMULQDQ
//! becomes a helper call and the table walk wins (4 KiB: 10.0 against 5.2 µs in that guest,
//! 2026-11-28), and there the CRC is most of what a 4 KiB packet costs (a 4 KiB memcpy takes
//! 0.95 µs). The two give the same value, so the choice changes only speed; `SOFTHCA_CRC=table`
//! or `=clmul` makes it without the timing.
//!
//! The walk reads its 16 bytes as two little-endian words: under TCG each load is a call into
//! the emulated MMU, and crc32fast's own table walk (a load per byte, 6.6 µs there) and the
//! `crc` crate's slicing-by-16 (8.4 µs) pay for that. Where the walk is the CRC, a copy that is
//! checksummed on the way stores the words the walk has read (`table_copy_update`) instead
//! of copying first and walking the copy: the sender's gather and the shared-memory ring's
//! receive each lose a 4 KiB copy per packet (shm RDMA Write 64 KiB in that guest, four
//! interleaved pairs: 0.275-0.299 -> 0.301-0.315 GB/s busy-poll, 0.265-0.277 -> 0.289-0.301
//! blocking).

use std::hint::black_box;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

/// Continues the CRC `crc` (crc32fast's value: 0 for nothing yet) over `bytes`.
#[inline]
pub fn update(crc: u32, bytes: &[u8]) -> u32 {
    match choice() {
        Kind::Clmul => clmul_update(crc, bytes),
        Kind::Table => table_update(crc, bytes),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Clmul = 1,
    Table = 2,
}

/// 0 until the first [`update`] decides.
static CHOICE: AtomicU8 = AtomicU8::new(0);

#[inline]
fn choice() -> Kind {
    match CHOICE.load(Ordering::Relaxed) {
        1 => Kind::Clmul,
        2 => Kind::Table,
        _ => decide(),
    }
}

/// Times both ways on a 4 KiB run (each three times, interleaved, after a first call that
/// warms the table and crc32fast's feature detection; the fastest of each) unless
/// `SOFTHCA_CRC` says; some microseconds once per process. Threads that race here may decide
/// differently, which is harmless: both give the same CRC.
#[cold]
fn decide() -> Kind {
    let kind = match named(std::env::var("SOFTHCA_CRC").ok().as_deref()) {
        Some(kind) => kind,
        None => {
            let buf = [0x5Au8; 4096];
            let time = |f: fn(u32, &[u8]) -> u32| {
                let at = Instant::now();
                black_box(f(0, black_box(&buf)));
                at.elapsed()
            };
            let (mut clmul, mut table) = (Duration::MAX, Duration::MAX);
            for round in 0..4 {
                let (c, t) = (time(clmul_update), time(table_update));
                if round > 0 {
                    (clmul, table) = (clmul.min(c), table.min(t));
                }
            }
            if table < clmul {
                Kind::Table
            } else {
                Kind::Clmul
            }
        }
    };
    CHOICE.store(kind as u8, Ordering::Relaxed);
    tracing::debug!(?kind, "CRC-32 implementation");
    kind
}

/// The way `SOFTHCA_CRC` names, if it names one.
fn named(var: Option<&str>) -> Option<Kind> {
    match var? {
        "table" => Some(Kind::Table),
        "clmul" => Some(Kind::Clmul),
        _ => None,
    }
}

fn clmul_update(crc: u32, bytes: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new_with_initial(crc);
    h.update(bytes);
    h.finalize()
}

/// `TABLES[k][b]`: the CRC register after byte `b` followed by `k` zero bytes.
static TABLES: [[u32; 256]; 16] = tables();

const fn tables() -> [[u32; 256]; 16] {
    let mut t = [[0u32; 256]; 16];
    let mut b = 0;
    while b < 256 {
        let mut c = b as u32;
        let mut bit = 0;
        while bit < 8 {
            c = if c & 1 != 0 { 0xEDB8_8320 ^ (c >> 1) } else { c >> 1 };
            bit += 1;
        }
        t[0][b] = c;
        b += 1;
    }
    let mut k = 1;
    while k < 16 {
        let mut b = 0;
        while b < 256 {
            let prev = t[k - 1][b];
            t[k][b] = (prev >> 8) ^ t[0][(prev & 0xff) as usize];
            b += 1;
        }
        k += 1;
    }
    t
}

/// Slicing-by-16: each 16 bytes, read as two words, step the register with one table lookup
/// per byte (the byte `i` of the block through the table of the 15 - i bytes after it).
fn table_update(crc: u32, bytes: &[u8]) -> u32 {
    let mut c = !crc;
    let mut blocks = bytes.chunks_exact(16);
    for block in &mut blocks {
        let (lo, hi) = block.split_at(8);
        let lo = u64::from_le_bytes(lo.try_into().unwrap_or_default());
        let hi = u64::from_le_bytes(hi.try_into().unwrap_or_default());
        c = table_step(c, lo, hi);
    }
    table_tail(c, blocks.remainder())
}

/// The register `c` (complemented, as the walk keeps it) after the 16 bytes `lo`, `hi`.
#[inline(always)]
fn table_step(c: u32, lo: u64, hi: u64) -> u32 {
    let at = |k: usize, word: u64, byte: u32| TABLES[k][((word >> (8 * byte)) & 0xff) as usize];
    let lo = lo ^ u64::from(c);
    (at(15, lo, 0) ^ at(14, lo, 1) ^ at(13, lo, 2) ^ at(12, lo, 3))
        ^ (at(11, lo, 4) ^ at(10, lo, 5) ^ at(9, lo, 6) ^ at(8, lo, 7))
        ^ (at(7, hi, 0) ^ at(6, hi, 1) ^ at(5, hi, 2) ^ at(4, hi, 3))
        ^ (at(3, hi, 4) ^ at(2, hi, 5) ^ at(1, hi, 6) ^ at(0, hi, 7))
}

/// The last bytes (fewer than 16) a byte at a time; returns crc32fast's value.
#[inline(always)]
fn table_tail(mut c: u32, rest: &[u8]) -> u32 {
    for &b in rest {
        c = TABLES[0][((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8);
    }
    !c
}

/// Whether this process computes the CRC by the table walk (see [`update`]): then a copy that
/// is checksummed on the way should be [`table_copy_update`], whose stores ride on the walk's
/// loads (under TCG a separate 4 KiB copy costs about a fifth of the walk).
#[inline]
pub(crate) fn walks_table() -> bool {
    choice() == Kind::Table
}

/// Copies `len` bytes from `src` to `dst` and continues `crc` (crc32fast's value) over them by
/// the table walk, from the very words it stores: the fused copy where the walk is the CRC
/// ([`walks_table`]). What is checksummed is what was written, whatever writes `src` meanwhile.
///
/// # Safety
/// `src` must be valid for `len` bytes of reads and `dst` for `len` bytes of writes, and the
/// two must not overlap.
pub(crate) unsafe fn table_copy_update(crc: u32, dst: *mut u8, src: *const u8, len: usize) -> u32 {
    let mut c = !crc;
    let mut at = 0;
    while at + 16 <= len {
        // SAFETY: `at..at + 16` lies inside both ranges (the loop bound, the caller's
        // contract); unaligned reads and writes.
        let (lo, hi) = unsafe {
            let lo = src.add(at).cast::<u64>().read_unaligned();
            let hi = src.add(at + 8).cast::<u64>().read_unaligned();
            dst.add(at).cast::<u64>().write_unaligned(lo);
            dst.add(at + 8).cast::<u64>().write_unaligned(hi);
            (u64::from_le(lo), u64::from_le(hi))
        };
        c = table_step(c, lo, hi);
        at += 16;
    }
    // SAFETY: the last `len - at` (< 16) bytes of both ranges; the tail is read back from
    // `dst`, which only this call writes.
    let rest = unsafe {
        std::ptr::copy_nonoverlapping(src.add(at), dst.add(at), len - at);
        std::slice::from_raw_parts(dst.add(at), len - at)
    };
    table_tail(c, rest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The table walk is crc32fast's CRC: the standard check value, and any run continued
    /// from any split.
    #[test]
    fn the_table_walk_gives_the_standard_check_value() {
        assert_eq!(table_update(0, b"123456789"), 0xCBF4_3926);
        assert_eq!(update(0, b"123456789"), 0xCBF4_3926);
        assert_eq!(table_update(0, b""), 0);
    }

    /// `SOFTHCA_CRC` names a way or leaves the choice to the timing.
    #[test]
    fn the_variable_names_a_way_or_none() {
        assert_eq!(named(Some("table")), Some(Kind::Table));
        assert_eq!(named(Some("clmul")), Some(Kind::Clmul));
        assert_eq!(named(Some("fast")), None);
        assert_eq!(named(None), None);
    }

    proptest! {
        #[test]
        fn both_ways_agree_on_every_split(bytes in proptest::collection::vec(any::<u8>(), 0..600), cut in 0usize..600, seed: u32) {
            let cut = cut.min(bytes.len());
            let (a, b) = bytes.split_at(cut);
            prop_assert_eq!(table_update(0, &bytes), crc32fast::hash(&bytes));
            prop_assert_eq!(table_update(table_update(0, a), b), crc32fast::hash(&bytes));
            prop_assert_eq!(table_update(seed, &bytes), clmul_update(seed, &bytes));
            prop_assert_eq!(update(seed, &bytes), clmul_update(seed, &bytes));
            let mut copy = vec![0u8; bytes.len()];
            // SAFETY: `copy` holds `bytes.len()` bytes; two vectors do not overlap.
            let fused = unsafe { table_copy_update(seed, copy.as_mut_ptr(), bytes.as_ptr(), bytes.len()) };
            prop_assert_eq!(fused, clmul_update(seed, &bytes));
            prop_assert_eq!(&copy, &bytes);
        }
    }
}
