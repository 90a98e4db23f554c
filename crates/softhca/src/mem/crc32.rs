//! The CRC-32 every ICRC is made of (IEEE 802.3's polynomial, reflected), in crc32fast's
//! convention: `update(0, bytes)` is the CRC of `bytes`, and `update(update(0, a), b)` that of
//! `a` followed by `b`.
//!
//! Three ways to compute it, one chosen per process by timing them on its first use
//! ([`update`]): crc32fast, which folds 16 bytes at a time by carry-less multiplication where
//! the CPU has it; a slicing-by-16 table walk; and a push by a sparse multiple of the
//! polynomial, shifts and XORs with no table (`SPARSE_OFFSETS`). On hardware the first wins
//! by far (4 KiB on the development machine: 111 ns, against 950 for the push and 1,460 for the
//! walk). Under an emulator that translates instructions, as qemu's TCG does for the rxe guest
//! of the benchmarks, every PCLMULQDQ becomes a helper call and every load a call into the
//! emulated MMU, and there the push wins (4 KiB in that guest, 2026-11-28: 2.29 µs, the walk
//! 5.9, the carry-less fold 10.0), where the CRC is most of what a 4 KiB packet costs (a 4 KiB
//! memcpy takes 0.95 µs). All give the same value, so the choice changes only speed;
//! `SOFTHCA_CRC=clmul`, `=table` or `=sparse` makes it without the timing.
//!
//! The walk and the push read their input as little-endian words: under TCG crc32fast's own
//! table walk (a load per byte, 6.6 µs there) and the `crc` crate's slicing-by-16 (8.4 µs) pay
//! for loading bytes. Where one of them is the CRC, a copy that is checksummed on the way
//! stores the words it has read (`fused_copy_update`) instead of copying first and walking the
//! copy: the sender's gather and the shared-memory ring's receive each lose a 4 KiB copy per
//! packet (in that guest the fused copy + CRC of 4 KiB takes 2.47 µs by the push, 5.43 by the
//! walk; perftest's `ib_write_bw` over shared memory, three interleaved pairs: 322-412 ->
//! 479-507 MiB/s busy-poll, 296-326 -> 470-486 blocking).
//!
//! Their loops over long runs (the walk and the push, plain and fused with a copy: four
//! kernels) are kept out of line, each in a section of its own (`.text.softhca_crc_*`), which
//! the drop-in library's link puts at the start of a 4 KiB page each
//! (`crates/softhca-ibverbs/crc-text.ld`): TCG chains a translated block straight to the next
//! only within one guest page, so a loop whose body crosses a page boundary looks its next
//! block up on every iteration. Two builds of the same code differed by 2.3x in the guest's
//! `ib_write_bw` over shm (258 against 631-664 MiB/s) because a fused copy's loop happened to
//! straddle a page in one of them. Short runs (fewer than `OUT_OF_LINE` bytes, 64) are walked
//! where they are asked for: out of line, the calls cost more than the walk.

use std::hint::black_box;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

/// Continues the CRC `crc` (crc32fast's value: 0 for nothing yet) over `bytes`.
#[inline]
pub fn update(crc: u32, bytes: &[u8]) -> u32 {
    match choice() {
        Kind::Clmul => clmul_update(crc, bytes),
        Kind::Table => table_update(crc, bytes),
        Kind::Sparse => sparse_update(crc, bytes),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Clmul = 1,
    Table = 2,
    Sparse = 3,
}

/// 0 until the first [`update`] decides.
static CHOICE: AtomicU8 = AtomicU8::new(0);

#[inline]
fn choice() -> Kind {
    match CHOICE.load(Ordering::Relaxed) {
        1 => Kind::Clmul,
        2 => Kind::Table,
        3 => Kind::Sparse,
        _ => decide(),
    }
}

/// A way to continue a CRC over bytes.
type Way = fn(u32, &[u8]) -> u32;

/// The ways, in the order the timing tries them (the first wins a tie).
const WAYS: [(Kind, Way); 3] =
    [(Kind::Clmul, clmul_update), (Kind::Table, table_update), (Kind::Sparse, sparse_update)];

/// Times every way on a 4 KiB run (each three times, interleaved, after a first call that
/// warms the tables and crc32fast's feature detection; the fastest of each) unless
/// `SOFTHCA_CRC` says; some microseconds once per process. Threads that race here may decide
/// differently, which is harmless: all give the same CRC.
#[cold]
fn decide() -> Kind {
    let kind = match named(std::env::var("SOFTHCA_CRC").ok().as_deref()) {
        Some(kind) => kind,
        None => {
            let buf = [0x5Au8; 4096];
            let time = |f: Way| {
                let at = Instant::now();
                black_box(f(0, black_box(&buf)));
                at.elapsed()
            };
            let mut best = [Duration::MAX; WAYS.len()];
            for round in 0..4 {
                for (b, (_, f)) in best.iter_mut().zip(WAYS) {
                    let t = time(f);
                    if round > 0 {
                        *b = (*b).min(t);
                    }
                }
            }
            let fastest = (0..WAYS.len()).min_by_key(|&i| best[i]).unwrap_or(0);
            WAYS[fastest].0
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
        "sparse" => Some(Kind::Sparse),
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

/// Runs shorter than this are checksummed where they are asked for; longer ones in a kernel
/// of their own page (see the module docs): under TCG a call out and back costs more than
/// walking a few bytes, and the packet path asks for the CRC of a handful of bytes at a time
/// (a PSN, an AETH, a short payload).
const OUT_OF_LINE: usize = 64;

/// Slicing-by-16: each 16 bytes, read as two words, step the register with one table lookup
/// per byte (the byte `i` of the block through the table of the 15 - i bytes after it).
#[inline]
fn table_update(crc: u32, bytes: &[u8]) -> u32 {
    if bytes.len() < OUT_OF_LINE {
        table_walk(crc, bytes)
    } else {
        table_kernel(crc, bytes)
    }
}

/// [`table_walk`] out of line, at the start of a page of its own.
#[inline(never)]
#[link_section = ".text.softhca_crc_table"]
fn table_kernel(crc: u32, bytes: &[u8]) -> u32 {
    table_walk(crc, bytes)
}

/// The walk itself, inlined where it runs (see [`table_update`]).
#[inline(always)]
fn table_walk(crc: u32, bytes: &[u8]) -> u32 {
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

/// The last bytes (fewer than 16): eight at a time if there are eight, then four, then a
/// byte at a time; returns crc32fast's value. The packet path's runs are mostly this short
/// (a PSN and what follows it, an AETH, an 8-byte payload), walked a byte at a time they cost
/// six instructions a byte.
#[inline(always)]
fn table_tail(mut c: u32, mut rest: &[u8]) -> u32 {
    let at = |k: usize, word: u64, byte: u32| TABLES[k][((word >> (8 * byte)) & 0xff) as usize];
    if let Some((eight, more)) = rest.split_first_chunk::<8>() {
        let w = u64::from_le_bytes(*eight) ^ u64::from(c);
        c = (at(7, w, 0) ^ at(6, w, 1) ^ at(5, w, 2) ^ at(4, w, 3))
            ^ (at(3, w, 4) ^ at(2, w, 5) ^ at(1, w, 6) ^ at(0, w, 7));
        rest = more;
    }
    if let Some((four, more)) = rest.split_first_chunk::<4>() {
        let w = u64::from(u32::from_le_bytes(*four) ^ c);
        c = at(3, w, 0) ^ at(2, w, 1) ^ at(1, w, 2) ^ at(0, w, 3);
        rest = more;
    }
    for &b in rest {
        c = TABLES[0][((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8);
    }
    !c
}

/// Whether this process computes the CRC by a way of this module (the table walk or the
/// sparse multiple, see [`update`]): then a copy that is checksummed on the way should be
/// [`fused_copy_update`], whose stores ride on the CRC's loads (under TCG a separate 4 KiB
/// copy costs about a fifth of the walk).
#[inline]
pub(crate) fn fuses_copy() -> bool {
    choice() != Kind::Clmul
}

/// Copies `len` bytes from `src` to `dst` and continues `crc` over them, by this process's way
/// where it has a fused copy ([`fuses_copy`]), else by the table walk's.
///
/// # Safety
/// As for [`table_copy_update`].
pub(crate) unsafe fn fused_copy_update(crc: u32, dst: *mut u8, src: *const u8, len: usize) -> u32 {
    match choice() {
        // SAFETY: the caller's contract.
        Kind::Sparse => unsafe { sparse_copy_update(crc, dst, src, len) },
        // SAFETY: the caller's contract.
        Kind::Table | Kind::Clmul => unsafe { table_copy_update(crc, dst, src, len) },
    }
}

/// Copies `len` bytes from `src` to `dst` and continues `crc` (crc32fast's value) over them by
/// the table walk, from the very words it stores: the fused copy where the walk is the CRC
/// (see [`fused_copy_update`]). What is checksummed is what was written, whatever writes `src`
/// meanwhile.
///
/// # Safety
/// `src` must be valid for `len` bytes of reads and `dst` for `len` bytes of writes, the two
/// must not overlap, and nothing else may write `dst` meanwhile (the tail is read back from
/// it).
#[inline]
unsafe fn table_copy_update(crc: u32, dst: *mut u8, src: *const u8, len: usize) -> u32 {
    if len < OUT_OF_LINE {
        // SAFETY: the caller's contract.
        unsafe { table_copy_walk(crc, dst, src, len) }
    } else {
        // SAFETY: the caller's contract.
        unsafe { table_copy_kernel(crc, dst, src, len) }
    }
}

/// [`table_copy_walk`] out of line, at the start of a page of its own.
///
/// # Safety
/// As for [`table_copy_update`].
#[inline(never)]
#[link_section = ".text.softhca_crc_table_copy"]
unsafe fn table_copy_kernel(crc: u32, dst: *mut u8, src: *const u8, len: usize) -> u32 {
    // SAFETY: the caller's contract.
    unsafe { table_copy_walk(crc, dst, src, len) }
}

/// The fused walk itself, inlined where it runs (see [`table_copy_update`]).
///
/// # Safety
/// As for [`table_copy_update`].
#[inline(always)]
unsafe fn table_copy_walk(crc: u32, dst: *mut u8, src: *const u8, len: usize) -> u32 {
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
    // SAFETY: `at <= len`, and the caller's contract.
    table_tail(c, unsafe { copy_rest(dst, src, at, len) })
}

/// Copies the bytes `at..len` a fused copy has left (fewer than a step's) and returns them as
/// written, for the CRC's tail.
///
/// # Safety
/// `at <= len`, and as for [`table_copy_update`]; the returned slice must be dropped before
/// anything else writes `dst`.
unsafe fn copy_rest<'a>(dst: *mut u8, src: *const u8, at: usize, len: usize) -> &'a [u8] {
    // SAFETY: `at..len` lies inside both ranges (the caller's contract); the bytes are read
    // back from `dst`, which only the caller writes meanwhile.
    unsafe {
        std::ptr::copy_nonoverlapping(src.add(at), dst.add(at), len - at);
        std::slice::from_raw_parts(dst.add(at), len - at)
    }
}

/// The sparse multiple: `x^161 + x^93 + x^77 + x^69 + x^68 + x^37 + 1` is a multiple of the
/// CRC's polynomial (a search over every such seven-term polynomial of degree up to 191 whose
/// other terms lie at least 64 below the top found three; this one spans the fewest words).
/// Adding a multiple of the polynomial to a message leaves its CRC as it is, so each message
/// bit can be cancelled by flipping the bits these distances after it: a 64-bit word is
/// cleared by XORing six shifted copies of it into the next three words, shifts and XORs only,
/// no table. What remains after the last word so pushed is three words, which the table walk
/// takes. Under TCG, where every load is a call into the emulated MMU and a shift or an XOR
/// is an instruction or two, that is a load per 8 bytes against the walk's nine per 8 (the
/// idea is Chorba's, arXiv 2412.16398; the polynomial is our own search's).
const SPARSE_OFFSETS: [u32; 6] = [68, 84, 92, 93, 124, 161];

/// Messages shorter than this take the table walk: the push leaves three words to it anyway.
const SPARSE_MIN: usize = 64;

/// Pushes the word `w` (the message's next 64 bits, with what earlier words pushed into it)
/// into the three after it, `ahead` (the next first), and moves the window on by one.
#[inline(always)]
fn sparse_push(w: u64, ahead: &mut [u64; 3]) {
    let mut next = [ahead[1], ahead[2], 0];
    for s in SPARSE_OFFSETS {
        // 64 <= s < 192: the low part lands `s / 64` words on, the high part one further.
        let (q, r) = ((s / 64) as usize, s % 64);
        next[q - 1] ^= w << r;
        if r != 0 {
            next[q] ^= w >> (64 - r);
        }
    }
    *ahead = next;
}

/// The CRC of the three words left after the push (what was pushed into them XORed in) and
/// the bytes after them (fewer than 8), from a cleared register: everything before them is
/// zero now, which does not move a cleared register.
#[inline(always)]
fn sparse_finish(last: [u64; 3], rest: &[u8]) -> u32 {
    let mut tail = [0u8; 16];
    tail[..8].copy_from_slice(&last[2].to_le_bytes());
    let n = 8 + rest.len().min(8);
    tail[8..n].copy_from_slice(&rest[..n - 8]);
    table_tail(table_step(0, last[0], last[1]), &tail[..n])
}

/// The CRC by the sparse multiple ([`SPARSE_OFFSETS`]).
#[inline]
fn sparse_update(crc: u32, bytes: &[u8]) -> u32 {
    if bytes.len() < SPARSE_MIN {
        table_walk(crc, bytes)
    } else {
        sparse_kernel(crc, bytes)
    }
}

/// [`sparse_update`] of at least [`SPARSE_MIN`] bytes, at the start of a page of its own.
#[inline(never)]
#[link_section = ".text.softhca_crc_sparse"]
fn sparse_kernel(crc: u32, bytes: &[u8]) -> u32 {
    let words = bytes.len() / 8;
    let (body, tail) = bytes.split_at(8 * (words - 3));
    let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or_default());
    // The register is the first four bytes' XOR, as in the walk.
    let mut ahead = [u64::from(!crc), 0, 0];
    for w in body.chunks_exact(8) {
        sparse_push(word(w) ^ ahead[0], &mut ahead);
    }
    let mut last = tail.chunks_exact(8);
    let mut left = [0u64; 3];
    for (l, (a, w)) in left.iter_mut().zip(ahead.iter().zip(&mut last)) {
        *l = word(w) ^ a;
    }
    sparse_finish(left, last.remainder())
}

/// [`table_copy_update`] by the sparse multiple: the words stored are the ones read.
///
/// # Safety
/// As for [`table_copy_update`].
#[inline]
unsafe fn sparse_copy_update(crc: u32, dst: *mut u8, src: *const u8, len: usize) -> u32 {
    if len < SPARSE_MIN {
        // SAFETY: the caller's contract.
        unsafe { table_copy_walk(crc, dst, src, len) }
    } else {
        // SAFETY: the caller's contract.
        unsafe { sparse_copy_kernel(crc, dst, src, len) }
    }
}

/// [`sparse_copy_update`] of at least [`SPARSE_MIN`] bytes, at the start of a page of its own.
///
/// # Safety
/// As for [`table_copy_update`].
#[inline(never)]
#[link_section = ".text.softhca_crc_sparse_copy"]
unsafe fn sparse_copy_kernel(crc: u32, dst: *mut u8, src: *const u8, len: usize) -> u32 {
    // SAFETY: word `k` is `8k..8k + 8`, inside both ranges for every `k` below `len / 8` (the
    // calls below); unaligned reads and writes.
    let copy = |k: usize| unsafe {
        let w = src.add(8 * k).cast::<u64>().read_unaligned();
        dst.add(8 * k).cast::<u64>().write_unaligned(w);
        u64::from_le(w)
    };
    let words = len / 8;
    let mut ahead = [u64::from(!crc), 0, 0];
    for k in 0..words - 3 {
        sparse_push(copy(k) ^ ahead[0], &mut ahead);
    }
    let left = [copy(words - 3) ^ ahead[0], copy(words - 2) ^ ahead[1], copy(words - 1) ^ ahead[2]];
    // SAFETY: `8 * words <= len`, and the caller's contract.
    sparse_finish(left, unsafe { copy_rest(dst, src, 8 * words, len) })
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
        assert_eq!(named(Some("sparse")), Some(Kind::Sparse));
        assert_eq!(named(Some("fast")), None);
        assert_eq!(named(None), None);
    }

    /// The sparse push is sound: the polynomial its distances stand for is a multiple of the
    /// CRC's, and every distance clears the word it pushes (64 or more) within the three
    /// words it keeps (under 192).
    #[test]
    fn the_sparse_polynomial_is_a_multiple_of_the_crc_polynomial() {
        // x^e mod P, P the CRC-32 polynomial in its normal (unreflected) form.
        let xmod =
            |e: u32| (0..e).fold(1u64, |r, _| if (r << 1) >> 32 != 0 { (r << 1) ^ 0x1_04C1_1DB7 } else { r << 1 });
        let top = *SPARSE_OFFSETS.iter().max().unwrap();
        let sum = SPARSE_OFFSETS.iter().fold(xmod(top), |acc, &s| acc ^ xmod(top - s));
        assert_eq!(sum, 0);
        assert!(SPARSE_OFFSETS.iter().all(|s| (64..192).contains(s)));
        assert_eq!(sparse_update(0, &[b'7'; 4096]), crc32fast::hash(&[b'7'; 4096]));
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
            prop_assert_eq!(sparse_update(seed, &bytes), clmul_update(seed, &bytes));
            prop_assert_eq!(sparse_update(sparse_update(seed, a), b), clmul_update(seed, &bytes));
            let mut copy = vec![0u8; bytes.len()];
            // SAFETY: as above.
            let fused = unsafe { sparse_copy_update(seed, copy.as_mut_ptr(), bytes.as_ptr(), bytes.len()) };
            prop_assert_eq!(fused, clmul_update(seed, &bytes));
            prop_assert_eq!(&copy, &bytes);
        }
    }
}
