//! Registered memory as the HCA addresses it: the bytes of a region (`Region`) and a checked
//! window into them ([`MemRef`]), the only way the transport touches application memory. Both
//! the verbs layer (which registers regions and checks keys) and the transport (which copies
//! and runs atomics) import this; it imports nothing of theirs.
//!
//! Registered memory is only ever touched through raw pointers, never through `&[u8]`: a
//! remote peer may write it at any moment, as a DMA engine would, so softhca never holds a
//! Rust reference to it while a region exists.
//!
//! The CRC-32 of every ICRC lives here too ([`crc32`]), beside the fused copy that folds it
//! on the way ([`copy_crc`]); and what Deregister waits for before the memory is the
//! program's again, the accesses in flight ([`inflight`]). A region of on-demand paging
//! reaches its memory through the kernel instead, access by access ([`odp`]).

pub mod crc32;
pub(crate) mod inflight;
pub mod odp;

use std::cell::Cell;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// Why an access was refused; the transport maps each to its completion status or NAK.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    #[error("no memory region or window has this key")]
    BadKey,
    #[error("the key belongs to another protection domain")]
    WrongPd,
    #[error("the range is not inside the region")]
    OutOfBounds,
    #[error("the region does not grant this access")]
    MissingRight,
    /// On-demand paging: a page of the range is not mapped, or not with the right the access
    /// needs (an HCA's page fault that cannot be served).
    #[error("a page of the range is not mapped for this access")]
    PageFault,
}

/// The memory of one registered region: `len` bytes at `ptr`, addressed by keys from `iova`
/// on (the host address, unless the program chose another: `ibv_reg_mr_iova`).
pub(crate) struct Region {
    ptr: NonNull<u8>,
    len: usize,
    iova: u64,
    /// The region owns its buffer (registered from a `Vec`) and frees it when dropped.
    owned: bool,
    /// On-demand paging: every access goes through the kernel ([`odp`]), none in place.
    on_demand: bool,
}

// SAFETY: the memory is reached only through raw pointers by `MemRef`'s copy and atomic
// helpers, whose callers have checked bounds; concurrent writers are the DMA model of an HCA
// (see the module comment). The fields are immutable after creation.
unsafe impl Send for Region {}
// SAFETY: as for Send: shared access never creates references into the buffer.
unsafe impl Sync for Region {}

impl Region {
    /// A region that owns `buf`.
    pub fn owned(buf: Vec<u8>) -> Region {
        let len = buf.len();
        let raw = Box::into_raw(buf.into_boxed_slice()) as *mut u8;
        // SAFETY: Box::into_raw never returns null (a zero-length box gives a dangling,
        // non-null pointer).
        let ptr = unsafe { NonNull::new_unchecked(raw) };
        Region { ptr, len, iova: raw as u64, owned: true, on_demand: false }
    }

    /// A region over memory the caller owns, addressed by keys from `iova` on; `None` for a
    /// null `addr`.
    ///
    /// # Safety
    /// `addr..addr+len` must stay valid for reads and writes until the region that holds it
    /// has been given up (its key out of the table, the key generation moved) and the
    /// accesses in flight have ended ([`inflight::quiesce`]): a `MemRef` the engine kept past
    /// that is not used again, since each of its uses re-checks its key once the generation
    /// has moved (one the consumer took, `Context::check_access`, is the consumer's to drop).
    /// The caller accepts concurrent writes by softhca and remote peers, as from a DMA engine.
    pub unsafe fn borrowed(addr: *mut u8, len: usize, iova: u64) -> Option<Region> {
        Some(Region { ptr: NonNull::new(addr)?, len, iova, owned: false, on_demand: false })
    }

    /// A region of on-demand paging over `addr..addr+len` of the process, addressed from `iova`
    /// on: the memory may be unmapped, now or later; each access finds out ([`odp`]). `None`
    /// for a null `addr`.
    ///
    /// # Safety
    /// An atomic on the region runs in place once its word was found mapped writable: the
    /// caller does not unmap memory under an atomic in flight (see [`odp`]). The caller accepts
    /// concurrent writes by softhca and remote peers, as from a DMA engine.
    pub unsafe fn on_demand(addr: *mut u8, len: usize, iova: u64) -> Option<Region> {
        Some(Region { ptr: NonNull::new(addr)?, len, iova, owned: false, on_demand: true })
    }

    /// The implicit region of on-demand paging: the whole address space, addressed by virtual
    /// address (all of it but address 0, which no memory has).
    ///
    /// # Safety
    /// As [`Region::on_demand`].
    pub unsafe fn implicit() -> Region {
        Region { ptr: NonNull::dangling(), len: usize::MAX - 1, iova: 1, owned: false, on_demand: true }
    }

    /// Whether it is the implicit region ([`Region::implicit`]), which no size bounds.
    pub fn is_implicit(&self) -> bool {
        self.on_demand && self.iova == 1 && self.len == usize::MAX - 1
    }

    /// Whether the region pages on demand.
    pub fn is_on_demand(&self) -> bool {
        self.on_demand
    }

    /// Faults in the `len` bytes at `addr` (a virtual address of the region), for writing if
    /// `write`: `ibv_advise_mr`'s prefetch. OutOfBounds outside the region, PageFault where a
    /// page is not mapped so.
    pub(crate) fn prefetch(&self, addr: u64, len: u64, write: bool) -> Result<(), AccessError> {
        let off = self.range_offset(addr, len).ok_or(AccessError::OutOfBounds)?;
        let host = (self.ptr.as_ptr() as usize).wrapping_add(off);
        match odp::populate(host, len as usize, write) {
            true => Ok(()),
            false => Err(AccessError::PageFault),
        }
    }

    /// The region's first virtual address: where keys address it from.
    pub fn addr(&self) -> u64 {
        self.iova
    }

    /// The memory is the caller's ([`Region::borrowed`]): once the region is given up, no
    /// access may be left in flight (see [`inflight`]).
    pub fn is_borrowed(&self) -> bool {
        !self.owned
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The offset of `[addr, addr + len)` in the region, if the region holds all of it.
    pub fn range_offset(&self, addr: u64, len: u64) -> Option<usize> {
        let off = addr.checked_sub(self.addr())?;
        let end = off.checked_add(len)?;
        (end <= self.len as u64).then_some(off as usize)
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: `ptr`/`len` came from `Box::<[u8]>::into_raw` in `owned` and are
            // reconstructed exactly once, here, when the last reference is gone.
            unsafe {
                drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len)));
            }
        }
    }
}

/// A checked window into a region: what an access check grants (`verbs::Context::check_access`). Holding it keeps a
/// region's own memory alive even if the MR is deregistered meanwhile; memory the program
/// lent (`Region::borrowed`) is its again once Deregister returns, and the engine uses a
/// `MemRef` into it only after its key is checked again (see [`inflight`]).
#[derive(Clone)]
pub struct MemRef {
    mem: Arc<Region>,
    /// The key that granted the access, for debugging output.
    key: u32,
    offset: usize,
    len: usize,
}

impl std::fmt::Debug for MemRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemRef")
            .field("key", &format_args!("{:#x}", self.key))
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}

/// The bytes at the end of a copy into registered memory that [`copy_in`] writes last, each
/// once, lowest address first.
const TAIL: usize = 64;

/// Copies `src` to `dst` as an HCA's DMA engine writes host memory: every byte of the last
/// [`TAIL`] once, in ascending order, after all the others.
///
/// Why the tail: a program that polls the last byte of its buffer for a Write's arrival and
/// then writes that byte itself (perftest's `ib_write_lat`, librdmacm's `riostream`, both
/// sending from the buffer they poll) must not have its store overwritten by the copy. glibc's
/// `memcpy` stores some bytes twice (a 64-byte copy's head and tail vectors are the same 64
/// bytes): once a Write's engine thread was preempted between the two, the program saw the
/// byte, stored its answer, and the second store put the old value back (riostream hung after
/// a few hundred to a few thousand round trips). The rest goes through `memcpy`, whose
/// repeated stores land before the tail's.
///
/// Ordinary stores throughout, as rxe's `memcpy` does and as DDIO places an Intel NIC's writes
/// in the last-level cache. Non-temporal stores into large regions (on AMD, regions of 8 MiB
/// or more, from a21f29a to 2026-11-30) won only where the two processes' cores share no
/// cache. On the 2-vCPU AMD EPYC, whose host moves the two vCPUs between cores that share a
/// cache and cores that do not, `softhca perf write --busy-poll` 64 KiB with depth 63 (a
/// 7.9 MiB landing region, ordinary stores) against depth 64 (8 MiB, streamed), alternating:
/// sharing a cache (26 pairs), shm 11.3-13.0 against 5.3-6.6 GB/s and UDP 4.4-5.1 against
/// 3.6-4.0; apart, shm 3.6-3.9 against 5.1-5.2 (and 11.2 against 5.5 once) and UDP 3.7-3.9
/// against 3.4-3.5. The default depth (16 MiB) apart, four pairs: shm 3.5-4.6 against 5.4-5.7,
/// UDP 3.2-3.7 against 3.2-3.5. perftest's `ib_write_bw`, whose 64 KiB buffer never streamed,
/// moves the same way with the placement (15.4 and 3.7 GB/s over shm). On the Intel Xeon
/// streaming had lost at every size.
///
/// # Safety
/// `dst` must be valid for `src.len()` bytes of writes and not overlap `src`.
#[inline]
unsafe fn copy_in(dst: *mut u8, src: &[u8]) {
    let tail_at = src.len().saturating_sub(TAIL);
    // SAFETY: the caller's contract; `tail_at` ≤ the length.
    unsafe {
        std::ptr::copy_nonoverlapping(src.as_ptr(), dst, tail_at);
        copy_ascending(dst.add(tail_at), &src[tail_at..]);
    }
}

/// Copies `src` to `dst` with volatile stores of 16 bytes, then one each of 8, 4, 2 and 1 as
/// the rest needs, lowest address first: each byte stored once, in that order (volatile stores
/// are neither merged nor reordered by the compiler; x86 makes ordinary stores visible in
/// program order).
///
/// # Safety
/// `dst` must be valid for `src.len()` bytes of writes and not overlap `src`.
#[inline]
unsafe fn copy_ascending(dst: *mut u8, src: &[u8]) {
    /// Stores `N` bytes at `at` and moves `at` past them.
    ///
    /// # Safety
    /// As `copy_ascending`'s, with `at + N` ≤ `src.len()`.
    #[inline(always)]
    unsafe fn store<const N: usize>(dst: *mut u8, src: &[u8], at: &mut usize) {
        // SAFETY: the caller's contract; an unaligned read, and a volatile write of a byte
        // array, whose alignment is 1.
        unsafe {
            let v = std::ptr::read_unaligned(src.as_ptr().add(*at).cast::<[u8; N]>());
            std::ptr::write_volatile(dst.add(*at).cast::<[u8; N]>(), v);
        }
        *at += N;
    }
    let mut at = 0;
    // SAFETY (of every store): each is taken only while its width fits in what is left.
    unsafe {
        while src.len() - at >= 16 {
            store::<16>(dst, src, &mut at);
        }
        if src.len() - at >= 8 {
            store::<8>(dst, src, &mut at);
        }
        if src.len() - at >= 4 {
            store::<4>(dst, src, &mut at);
        }
        if src.len() - at >= 2 {
            store::<2>(dst, src, &mut at);
        }
        if src.len() > at {
            store::<1>(dst, src, &mut at);
        }
    }
}

/// Copies `len` bytes from `src` to `dst` and returns the CRC-32 (the ICRC's polynomial) of
/// those bytes continued from `crc`, in crc32fast's convention: the CRC of everything before,
/// 0 for nothing. The bytes are read once: the CRC is folded from the very registers the copy
/// stores, where a copy then a CRC pass reads the destination back (and, when it is a shared-
/// memory ring slot whose lines another core holds, waits for the copy's stores to land
/// first). What is checksummed is exactly what was written, whatever writes `src` meanwhile.
/// Issue 13's "one fused copy + ICRC pass per byte"; `cargo bench --bench wire` (`copy+icrc`)
/// measures it against the two passes. Three kernels, by what the CPU does best: the
/// AVX-512 fold below (runs of [`COPY_CRC_MIN`] bytes and more), the table walk or the sparse
/// push storing the words it reads where the process computes CRCs that way
/// ([`crc32::fuses_copy`]: under an emulator), else a copy, then crc32fast over the copy.
///
/// # Safety
/// `src` must be valid for `len` bytes of reads and `dst` for `len` bytes of writes, and the
/// two must not overlap. `dst` must be memory no one else writes meanwhile (the CRC of a
/// short run is taken over it after the copy).
pub(crate) unsafe fn copy_crc_raw(dst: *mut u8, src: *const u8, len: usize, crc: u32) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if len >= COPY_CRC_MIN && fused::available() {
        // SAFETY: the caller's contract; the CPU has the kernel's features (checked).
        return unsafe { fused::copy_crc(dst, src, len, crc) };
    }
    if crc32::fuses_copy() {
        // SAFETY: the caller's contract.
        return unsafe { crc32::fused_copy_update(crc, dst, src, len) };
    }
    // SAFETY: the caller's contract.
    unsafe { copy_then_crc(dst, src, len, crc) }
}

/// Runs shorter than this take the two passes even where the fused kernel runs: below one of
/// its 256-byte steps there is nothing to fold. A packet whose payload is shorter is cheaper
/// copied plainly and checksummed in one pass with its headers (see `transport::engine::emit`).
pub const COPY_CRC_MIN: usize = 256;

/// The two-pass form of [`copy_crc_raw`]: a copy, then the CRC ([`crc32`]) over the
/// destination.
///
/// # Safety
/// As for [`copy_crc_raw`].
unsafe fn copy_then_crc(dst: *mut u8, src: *const u8, len: usize, crc: u32) -> u32 {
    // SAFETY: the caller's contract: both ranges valid and disjoint, `dst` ours meanwhile.
    let copied = unsafe {
        std::ptr::copy_nonoverlapping(src, dst, len);
        std::slice::from_raw_parts(dst, len)
    };
    crc32::update(crc, copied)
}

/// The fused copy and CRC (`copy_crc_raw`) between two slices: copies `src` into the start of
/// `dst` (as much of it as fits) and returns the CRC continued from `crc` over what was copied.
pub fn copy_crc(dst: &mut [u8], src: &[u8], crc: u32) -> u32 {
    let len = src.len().min(dst.len());
    // SAFETY: both slices hold `len` bytes; a `&mut` and a `&` slice never overlap.
    unsafe { copy_crc_raw(dst.as_mut_ptr(), src.as_ptr(), len, crc) }
}

/// The CRC-32 of `len` bytes at `src` continued from `crc` (crc32fast's convention), read
/// through raw pointers only (registered memory is never lent out as a slice, see the module
/// docs): the fused kernel's fold without its stores where it runs, else the bytes copied
/// through a small buffer and checksummed there.
///
/// # Safety
/// `src` must be valid for `len` bytes of reads.
pub(crate) unsafe fn crc_raw(src: *const u8, len: usize, crc: u32) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if len >= COPY_CRC_MIN && fused::available() {
        // SAFETY: the caller's contract; the CPU has the kernel's features (checked).
        return unsafe { fused::crc(src, len, crc) };
    }
    // SAFETY: the caller's contract.
    unsafe { crc_copied(src, len, crc) }
}

/// [`crc_raw`] through a buffer on the stack, a few hundred bytes at a time.
///
/// # Safety
/// As for [`crc_raw`].
unsafe fn crc_copied(src: *const u8, len: usize, mut crc: u32) -> u32 {
    let mut chunk = [0u8; 512];
    let mut at = 0;
    while at < len {
        let n = (len - at).min(chunk.len());
        // SAFETY: `at..at + n` lies inside the caller's range; `chunk` is ours.
        unsafe { std::ptr::copy_nonoverlapping(src.add(at), chunk.as_mut_ptr(), n) };
        crc = crc32::update(crc, &chunk[..n]);
        at += n;
    }
    crc
}

thread_local! {
    /// Set while [`to_far_lines`] runs its closure on this thread.
    static FAR_LINES: Cell<bool> = const { Cell::new(false) };
    /// Set while [`landing_ahead`] runs its closure on this thread.
    static LANDING_AHEAD: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with `flag` set on this thread; the flag is as it was after, even if `f` unwinds.
fn with_flag<R>(flag: &'static std::thread::LocalKey<Cell<bool>>, f: impl FnOnce() -> R) -> R {
    struct Reset(&'static std::thread::LocalKey<Cell<bool>>, bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            self.0.with(|c| c.set(self.1));
        }
    }
    let _reset = Reset(flag, flag.with(|c| c.replace(true)));
    f()
}

/// Runs `f` with the gathers it makes ([`MemRef::read_crc`]) writing into memory whose lines
/// another core holds: a shared-memory ring slot the peer's core read on the lap before, while
/// that core shares no cache with this one (`link::shm`'s `Distance`). The CRC is taken over
/// the source first and the bytes are then copied with `memcpy`, which on a CPU with fast
/// short `rep movsb` (glibc takes it from 2112 bytes) writes whole lines without first
/// fetching them from the far core; the fused pass's vector stores each wait for their line
/// to come over. On the 2-vCPU AMD EPYC, perftest's `ib_write_bw` 64 KiB over shm, busy-poll,
/// against the fused pass, alternating (2026-11-30): apart 4.90-5.89 against 3.46-4.45 GB/s;
/// where the two cores share a cache this order loses a third (7.75-10.43 against
/// 16.03-16.56), hence the measured distance. What is checksummed is then what was read
/// before the copy, not the copy: a source the application changes under a send in flight
/// (which the verbs forbid) gives a datagram whose ICRC fails, which the receiver drops.
pub(crate) fn to_far_lines<R>(f: impl FnOnce() -> R) -> R {
    with_flag(&FAR_LINES, f)
}

/// Runs `f` with each packet it lands in a large region ([`MemRef::write`]) first asking for
/// the [`LAND_AHEAD`] bytes after its own, writable: where the next packet of the same message
/// lands. The hardware's stream prefetcher does not cross a 4 KiB page, one packet's payload
/// at the 4096 MTU, so each packet's first stores waited for their lines to come from memory.
///
/// Worth it only where the receiving thread bounds the flow and its landing lines are cold:
/// - The shared-memory link's receiver makes two copies a packet (the ring's, then this one)
///   and runs its deliveries under this. On the 2-vCPU AMD EPYC with the vCPUs sharing a
///   cache, `softhca perf write --link shm` 64 KiB (a 16 MiB landing region), interleaved
///   against the same code without it (2026-11-30): busy-poll 10.16-10.52 -> 12.39-12.73
///   GB/s, blocking 10.11-10.71 -> 12.34-13.15. Apart, where the placement alone moves that
///   figure between 3.5 and 6.6 from one run to the next, no difference stood out.
/// - perftest's `ib_write_bw` lands in one 64 KiB buffer that stays in cache: there the hints
///   only cost (15.0-15.9 -> 14.4-14.5 GB/s), hence [`LAND_AHEAD_REGION`].
/// - The UDP link's responder idles beside a sender bound by the kernel; with the hints it
///   lost 2-7%, their traffic taken from the sender on the other vCPU of the same core.
pub(crate) fn landing_ahead<R>(f: impl FnOnce() -> R) -> R {
    with_flag(&LANDING_AHEAD, f)
}

/// How much of what follows a packet landed [`landing_ahead`] asks for: the next packet's
/// payload at the 4096 MTU. A quarter of it, or every other line, gained nothing.
#[cfg(target_arch = "x86_64")]
const LAND_AHEAD: usize = 4096;

/// Packets shorter than this ask for nothing ahead (see [`landing_ahead`]): a payload at an
/// MTU of 1024 or more, whose message likely goes on right after it.
#[cfg(target_arch = "x86_64")]
const LAND_AHEAD_MIN: usize = 1024;

/// Regions smaller than this ask for nothing ahead (see [`landing_ahead`]): one that fits in
/// a core's L2 (1 MiB on the EPYC) is likely still there from the last lap.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const LAND_AHEAD_REGION: usize = 1 << 20;

/// [`prefetch_w`] for each line of the `len` bytes at `p`. A loop kept out of line: the same
/// 64 prefetches unrolled into the copy gained half as much (`softhca perf write --link shm`,
/// 11.85-12.08 against 12.55-12.89 GB/s, interleaved).
#[cfg(target_arch = "x86_64")]
#[inline(never)]
pub(crate) fn prefetch_w_run(p: *const u8, len: usize) {
    let mut off = 0;
    while off < len {
        prefetch_w(p.wrapping_add(off));
        off += 64;
    }
}

/// `prefetchw`: the line at `p` into this core's cache, owned for writing. Every x86-64 CPU
/// decodes it (those before Intel's Broadwell as a no-op), so it needs no feature check.
#[cfg(target_arch = "x86_64")]
#[inline]
fn prefetch_w(p: *const u8) {
    // SAFETY: a prefetch is a hint: it never faults, whatever the address, and changes no
    // memory, register or flag.
    unsafe { std::arch::asm!("prefetchw [{}]", in(reg) p, options(nostack, preserves_flags, readonly)) };
}

/// The fused copy and CRC-32 on x86_64 with AVX-512 and VPCLMULQDQ: the classic folding of a
/// reflected CRC by carry-less multiplication (Gopal et al., "Fast CRC Computation for
/// Generic Polynomials Using PCLMULQDQ Instruction", Intel, 2009), sixteen 128-bit lanes in
/// four ZMM registers, 256 bytes a step, each step's loads stored to the destination as they
/// are folded in.
#[cfg(target_arch = "x86_64")]
mod fused {
    use std::arch::x86_64::*;

    /// x^n mod P for the CRC-32 polynomial P = 0x1_04C1_1DB7, bit 31 the coefficient of x^31.
    const fn x_pow_mod_p(n: u32) -> u32 {
        let mut r: u64 = 1;
        let mut i = 0;
        while i < n {
            r <<= 1;
            if r >> 32 != 0 {
                r ^= 0x1_04C1_1DB7;
            }
            i += 1;
        }
        r as u32
    }

    /// The multiplier that folds the 64-bit half of a lane `bits` + or - 32 bits forward, in
    /// the reflected domain (bit-reversed, shifted left once): a lane folded `d` bits forward
    /// multiplies its low half by `key(d + 32)` and its high half by `key(d - 32)`.
    pub(super) const fn key(bits: u32) -> i64 {
        ((x_pow_mod_p(bits).reverse_bits() as u64) << 1) as i64
    }

    /// How far ahead of its loads the fold asks for the source's lines: two 4 KiB pages. A
    /// gather's run is most often followed by the next packet's, the next bytes of the same
    /// buffer (a message's packets take consecutive bytes), and the hardware's stream
    /// prefetcher stops at each 4 KiB page, which at the 4096 MTU is one packet's payload:
    /// without the hint every packet's first loads waited for memory. On the 2-vCPU AMD EPYC,
    /// `softhca perf write --link udp --busy-poll` (128 buffers of 64 KiB, the sender bound by
    /// its thread), interleaved (2026-11-30): 4.10-4.46 -> 5.25-5.33 GB/s with the vCPUs
    /// sharing a cache, 3.51-3.71 -> 3.84-4.06 apart; one page ahead gained less together,
    /// three and four less apart; perftest's `ib_write_bw` (one hot buffer) and the shm link
    /// level.
    const AHEAD: usize = 8192;

    /// Folding distances: one step (four registers, 2048 bits), one register (512), one lane (128).
    const STEP: (i64, i64) = (key(2048 + 32), key(2048 - 32));
    const REG: (i64, i64) = (key(512 + 32), key(512 - 32));
    const LANE: (i64, i64) = (key(128 + 32), key(128 - 32));

    /// The fold's features, and PCLMULQDQ, which its last 128-bit lanes use (every CPU with
    /// the two has it, but a VM's CPUID may be masked oddly).
    pub fn available() -> bool {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("vpclmulqdq")
            && is_x86_feature_detected!("pclmulqdq")
    }

    /// `a` folded forward by the distance of `k` (low and high halves per lane), XORed into `b`.
    #[inline]
    #[target_feature(enable = "avx512f,vpclmulqdq")]
    fn fold512(a: __m512i, b: __m512i, k: __m512i) -> __m512i {
        let lo = _mm512_clmulepi64_epi128(a, k, 0x00);
        let hi = _mm512_clmulepi64_epi128(a, k, 0x11);
        _mm512_ternarylogic_epi64(lo, hi, b, 0x96) // lo ^ hi ^ b
    }

    #[inline]
    #[target_feature(enable = "avx512f,vpclmulqdq")]
    fn fold128(a: __m128i, b: __m128i, k: __m128i) -> __m128i {
        _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(a, k, 0x00), _mm_clmulepi64_si128(a, k, 0x11)), b)
    }

    /// See [`super::copy_crc_raw`].
    ///
    /// # Safety
    /// As for [`super::copy_crc_raw`], with `len >= COPY_CRC_MIN`, on a CPU with AVX-512F and
    /// VPCLMULQDQ ([`available`]).
    #[target_feature(enable = "avx512f,vpclmulqdq")]
    pub unsafe fn copy_crc(dst: *mut u8, src: *const u8, len: usize, crc: u32) -> u32 {
        // SAFETY: the caller's contract.
        unsafe { fold::<true>(dst, src, len, crc) }
    }

    /// The CRC-32 of `len` bytes at `src` continued from `crc`, as [`copy_crc`] folds it,
    /// storing nothing.
    ///
    /// # Safety
    /// `src` must be valid for `len` bytes of reads, `len >= COPY_CRC_MIN`, on a CPU with
    /// AVX-512F and VPCLMULQDQ ([`available`]).
    #[target_feature(enable = "avx512f,vpclmulqdq")]
    pub unsafe fn crc(src: *const u8, len: usize, crc: u32) -> u32 {
        // SAFETY: the caller's contract; `dst` is never written with STORE false.
        unsafe { fold::<false>(std::ptr::null_mut(), src, len, crc) }
    }

    /// The fold of [`copy_crc`]; with `STORE` false `dst` is not touched.
    ///
    /// # Safety
    /// As for [`copy_crc`] (`dst` only where `STORE`).
    #[inline]
    #[target_feature(enable = "avx512f,vpclmulqdq")]
    unsafe fn fold<const STORE: bool>(dst: *mut u8, src: *const u8, len: usize, crc: u32) -> u32 {
        debug_assert!(len >= super::COPY_CRC_MIN);
        let step = _mm512_set_epi64(STEP.1, STEP.0, STEP.1, STEP.0, STEP.1, STEP.0, STEP.1, STEP.0);
        // SAFETY (of every load and store): offsets `at..at + 256` stay below `len` (the loop
        // bound), inside both ranges (the caller's contract); unaligned forms.
        let mv = |at: usize| unsafe {
            let v = _mm512_loadu_si512(src.add(at).cast());
            if STORE {
                _mm512_storeu_si512(dst.add(at).cast(), v);
            }
            v
        };
        let (mut v0, mut v1, mut v2, mut v3) = (mv(0), mv(64), mv(128), mv(192));
        // The CRC so far enters as the complement of crc32fast's value, XORed into the first
        // four bytes (the register a bytewise CRC would hold before them).
        v0 = _mm512_xor_si512(v0, _mm512_castsi128_si512(_mm_cvtsi32_si128(!crc as i32)));
        let mut at = 256;
        while at + 256 <= len {
            // Ask for the lines `AHEAD` bytes on (a prefetch never faults, wherever it points).
            let ahead = src.wrapping_add(at + AHEAD).cast::<i8>();
            for line in [0, 64, 128, 192] {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line));
            }
            v0 = fold512(v0, mv(at), step);
            v1 = fold512(v1, mv(at + 64), step);
            v2 = fold512(v2, mv(at + 128), step);
            v3 = fold512(v3, mv(at + 192), step);
            at += 256;
        }
        // The four registers into one, then each whole 64 bytes left into it the same way:
        // the rest of the run is shorter than a register.
        let reg = _mm512_set_epi64(REG.1, REG.0, REG.1, REG.0, REG.1, REG.0, REG.1, REG.0);
        let mut v = fold512(fold512(fold512(v0, v1, reg), v2, reg), v3, reg);
        while at + 64 <= len {
            v = fold512(v, mv(at), reg);
            at += 64;
        }
        // Its four lanes into its last.
        let lane = _mm_set_epi64x(LANE.1, LANE.0);
        let mut x = _mm512_extracti32x4_epi32(v, 0);
        x = fold128(x, _mm512_extracti32x4_epi32(v, 1), lane);
        x = fold128(x, _mm512_extracti32x4_epi32(v, 2), lane);
        x = fold128(x, _mm512_extracti32x4_epi32(v, 3), lane);
        // What is left stands for everything so far as sixteen bytes a CRC register at zero
        // takes in (crc32fast's value 0xFFFF_FFFF); the rest of the run, fewer than 64 bytes,
        // follows them in one buffer: one short CRC a run, over the bytes stored.
        let rest = len - at;
        let mut last = [0u8; 16 + 63];
        // SAFETY: `last` holds 16 bytes and then `rest` < 64 more; the rest of the source range
        // and, with STORE, of the destination (the caller's contract; `dst` is ours meanwhile).
        unsafe {
            _mm_storeu_si128(last.as_mut_ptr().cast(), x);
            std::ptr::copy_nonoverlapping(src.add(at), last.as_mut_ptr().add(16), rest);
            if STORE {
                std::ptr::copy_nonoverlapping(last.as_ptr().add(16), dst.add(at), rest);
            }
        }
        super::crc32::update(0xFFFF_FFFF, &last[..16 + rest])
    }
}

impl MemRef {
    /// `len` bytes at `offset` of `mem`; the caller has checked they lie inside it, and this
    /// checks again (once per key check, not per access): `bytes_at` and `atomic_u64` rely on
    /// it for their pointer arithmetic.
    pub(crate) fn new(mem: &Arc<Region>, key: u32, offset: usize, len: usize) -> MemRef {
        assert!(offset.checked_add(len).is_some_and(|end| end <= mem.len), "a MemRef outside its region");
        MemRef { mem: mem.clone(), key, offset, len }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `src` into the window at `at`. Out-of-window writes are refused.
    pub fn write(&self, at: usize, src: &[u8]) -> std::result::Result<(), AccessError> {
        if self.mem.on_demand {
            return odp::write(self.address_at(at, src.len())?, src);
        }
        let dst = self.bytes_at(at, src.len())?;
        #[cfg(target_arch = "x86_64")]
        if src.len() >= LAND_AHEAD_MIN && self.mem.len >= LAND_AHEAD_REGION && LANDING_AHEAD.with(Cell::get) {
            // `black_box`: a loop, not the prefetches unrolled (see `prefetch_w_run`).
            prefetch_w_run(dst.wrapping_add(src.len()), std::hint::black_box(LAND_AHEAD));
        }
        // SAFETY: `bytes_at` put the destination inside the live allocation, which `self.mem`
        // keeps alive; `src` is a caller's slice, which cannot overlap registered memory that
        // softhca never lends out as a slice.
        unsafe { copy_in(dst, src) };
        Ok(())
    }

    /// Copies from the window at `at` into `dst`.
    pub fn read(&self, at: usize, dst: &mut [u8]) -> std::result::Result<(), AccessError> {
        if self.mem.on_demand {
            return odp::read(self.address_at(at, dst.len())?, dst);
        }
        let src = self.bytes_at(at, dst.len())?;
        // SAFETY: as in `write`, the source range is inside the live allocation and `dst` is a
        // distinct caller-owned buffer.
        unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// [`MemRef::read`] that also continues the CRC-32 `crc` over the bytes it copies
    /// (see [`copy_crc`]): the sender's gather and its ICRC in one pass.
    pub fn read_crc(&self, at: usize, dst: &mut [u8], crc: u32) -> std::result::Result<u32, AccessError> {
        if self.mem.on_demand {
            odp::read(self.address_at(at, dst.len())?, dst)?;
            return Ok(crc32::update(crc, dst));
        }
        let src = self.bytes_at(at, dst.len())?;
        if FAR_LINES.with(Cell::get) {
            // SAFETY: as in `read`; see `to_far_lines` for the order.
            return Ok(unsafe {
                let crc = crc_raw(src, dst.len(), crc);
                std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len());
                crc
            });
        }
        // SAFETY: as in `read`.
        Ok(unsafe { copy_crc_raw(dst.as_mut_ptr(), src, dst.len(), crc) })
    }

    /// The address of `len` bytes at `at` of the window of an on-demand region, which is
    /// never dereferenced here (the kernel copies, see [`odp`]); out-of-window ranges refused.
    fn address_at(&self, at: usize, len: usize) -> std::result::Result<usize, AccessError> {
        Ok((self.mem.ptr.as_ptr() as usize).wrapping_add(self.offset + self.inside(at, len)?))
    }

    /// `at`, if `len` bytes from it lie inside the window: every accessor's bounds check.
    fn inside(&self, at: usize, len: usize) -> std::result::Result<usize, AccessError> {
        match at.checked_add(len) {
            Some(end) if end <= self.len => Ok(at),
            _ => Err(AccessError::OutOfBounds),
        }
    }

    /// Whether `len` bytes at `at` of the window can be read now: always for a pinned region
    /// (in the window); for an on-demand one, each page probed ([`odp`]).
    pub fn readable(&self, at: usize, len: usize) -> bool {
        match self.mem.on_demand {
            false => self.inside(at, len).is_ok(),
            true => self.address_at(at, len).is_ok_and(|a| odp::readable(a, len)),
        }
    }

    /// Whether the window is in a region of on-demand paging.
    pub fn is_on_demand(&self) -> bool {
        self.mem.on_demand
    }

    /// Whether the window's memory is there for an access in place (an atomic): always for a
    /// pinned region; for an on-demand one, the pages mapped readable, and writable if
    /// `write` (a page fault otherwise).
    pub fn present(&self, write: bool) -> std::result::Result<(), AccessError> {
        if !self.mem.on_demand {
            return Ok(());
        }
        let at = self.address_at(0, self.len)?;
        let there = if write { odp::writable_now(at, self.len) } else { odp::readable(at, self.len) };
        if there {
            return Ok(());
        }
        Err(AccessError::PageFault)
    }

    /// Where `len` bytes at `at` of the window start in memory; out-of-window ranges refused.
    fn bytes_at(&self, at: usize, len: usize) -> std::result::Result<*mut u8, AccessError> {
        let at = self.inside(at, len)?;
        // SAFETY: offset + at <= offset + len <= mem.len (checked above and by the access
        // check that made this MemRef): inside the live allocation, or one past its end.
        Ok(unsafe { self.mem.ptr.as_ptr().add(self.offset + at) })
    }

    /// The 8-byte word at the start of the window, for atomics. `None` unless the window is
    /// 8 bytes long and 8-byte aligned (ERR-RQ-5 is checked by the responder before this).
    pub fn atomic_u64(&self) -> Option<&AtomicU64> {
        let p = match self.mem.on_demand {
            // The address itself: the implicit region's base points at nothing (address 1).
            true => {
                std::ptr::with_exposed_provenance_mut::<u8>((self.mem.ptr.as_ptr() as usize).wrapping_add(self.offset))
            }
            false => self.mem.ptr.as_ptr().wrapping_add(self.offset),
        };
        if self.len != 8 || !(p as usize).is_multiple_of(8) {
            return None;
        }
        // SAFETY: p is 8-byte aligned, points at 8 bytes inside the live allocation, and the
        // returned reference borrows `self`, which keeps the allocation alive. Every access
        // softhca makes to these bytes while they serve an atomic is through this AtomicU64.
        Some(unsafe { AtomicU64::from_ptr(p as *mut u64) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every alignment of the destination and every length around the tail lands exactly the
    /// source bytes, and nothing outside the window.
    #[test]
    fn writes_land_exactly_at_every_alignment_and_length() {
        let src: Vec<u8> = (0..6000u32).map(|i| (i * 7 + 3) as u8).collect();
        for at in [0usize, 1, 7, 15, 16, 33, 64, 1000] {
            for len in [0usize, 1, 15, 16, 17, TAIL - 1, TAIL, TAIL + 1, 1024, 4096, 4111, 6000] {
                if at + len > 8192 {
                    continue;
                }
                let mut back = vec![0xEEu8; 8192];
                // SAFETY: `at + len` is inside `back`, a buffer of its own.
                unsafe { copy_in(back.as_mut_ptr().add(at), &src[..len]) };
                let what = format!("at {at} len {len}");
                assert!(back[..at].iter().all(|&b| b == 0xEE), "before the window: {what}");
                assert_eq!(&back[at..at + len], &src[..len], "{what}");
                assert!(back[at + len..].iter().all(|&b| b == 0xEE), "after the window: {what}");
            }
        }
    }

    /// Packets landed with the next one's lines asked for (`landing_ahead`) land exactly, up to
    /// the region's last byte (the hint then points past the region, and must not fault), and
    /// the scope ends with the closure.
    #[test]
    fn packets_landed_ahead_land_exactly_up_to_the_regions_end() {
        let len = LAND_AHEAD_REGION;
        let region = Arc::new(Region::owned(vec![0; len]));
        let m = MemRef::new(&region, 1, 0, len);
        let src: Vec<u8> = (0..4096u32).map(|i| (i * 13 + 5) as u8).collect();
        landing_ahead(|| {
            for at in [0, 4096, len - 2 * 4096, len - 4096] {
                m.write(at, &src).unwrap();
            }
            assert_eq!(m.write(len - 4095, &src), Err(AccessError::OutOfBounds));
        });
        assert!(!LANDING_AHEAD.with(Cell::get));
        for at in [0, 4096, len - 2 * 4096, len - 4096] {
            let mut back = vec![0u8; 4096];
            m.read(at, &mut back).unwrap();
            assert_eq!(back, src, "at {at}");
        }
        let mut gap = vec![1u8; 4096];
        m.read(2 * 4096, &mut gap).unwrap();
        assert!(gap.iter().all(|&b| b == 0));
    }

    /// A window's write lands inside the window only.
    #[test]
    fn window_writes_stay_in_the_window() {
        let m = MemRef::new(&Arc::new(Region::owned(vec![0xEE; 8192])), 1, 4096, 2048);
        m.write(100, &[7; 1500]).unwrap();
        assert!(m.write(1000, &[7; 1049]).is_err());
        let mut back = vec![0u8; 2048];
        m.read(0, &mut back).unwrap();
        assert!(back[..100].iter().all(|&b| b == 0xEE) && back[100..1600].iter().all(|&b| b == 7));
        assert!(back[1600..].iter().all(|&b| b == 0xEE));
    }

    /// The folding multipliers come out as the published ones (Gopal et al.; crc32fast's
    /// fold-by-4 and fold-by-1 constants).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn fold_keys_are_the_published_constants() {
        assert_eq!(fused::key(4 * 128 + 32), 0x1_5444_2bd4);
        assert_eq!(fused::key(4 * 128 - 32), 0x1_c6e4_1596);
        assert_eq!(fused::key(128 + 32), 0x1_7519_97d0);
        assert_eq!(fused::key(128 - 32), 0x0_ccaa_009e);
    }

    /// The fused copy lands exactly the source bytes and gives crc32fast's CRC, continued from
    /// any value, at every length up to a few steps and at every alignment of either end; the
    /// two-pass form (what a CPU without AVX-512 runs) too.
    #[test]
    fn copy_crc_is_a_copy_and_crc32fasts_crc() {
        let src: Vec<u8> = (0..9000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        let mut dst = vec![0u8; 9100];
        let lens = (0..1100).chain([2047, 2048, 2049, 4095, 4096, 4100, 4112, 8192, 8999 - 64]);
        for len in lens {
            for (s_at, d_at) in [(0, 0), (1, 0), (0, 3), (7, 63), (63, 17)] {
                for crc in [0u32, 0xdead_beef] {
                    let mut h = crc32fast::Hasher::new_with_initial(crc);
                    h.update(&src[s_at..s_at + len]);
                    let want = h.finalize();
                    dst.fill(0xAA);
                    let got = copy_crc(&mut dst[d_at..d_at + len], &src[s_at..s_at + len], crc);
                    assert_eq!(got, want, "len {len} src+{s_at} dst+{d_at}");
                    assert_eq!(&dst[d_at..d_at + len], &src[s_at..s_at + len], "len {len}");
                    assert!(dst[..d_at].iter().chain(&dst[d_at + len..]).all(|&b| b == 0xAA), "len {len}");
                    // SAFETY: both ranges lie inside their vectors, which do not overlap.
                    let two = unsafe { copy_then_crc(dst.as_mut_ptr().add(d_at), src.as_ptr().add(s_at), len, crc) };
                    assert_eq!(two, want, "two passes, len {len}");
                    // SAFETY: the range lies inside `src`.
                    let read_only = unsafe { crc_raw(src.as_ptr().add(s_at), len, crc) };
                    assert_eq!(read_only, want, "the CRC alone, len {len}");
                }
            }
        }
    }

    /// `read_crc` is `read` plus the CRC, and refuses what `read` refuses.
    #[test]
    fn read_crc_reads_and_checksums_the_window() {
        let bytes: Vec<u8> = (0..8192u32).map(|i| (i * 13 + 5) as u8).collect();
        let region = Arc::new(Region::owned(bytes.clone()));
        let m = MemRef::new(&region, 1, 100, 5000);
        let mut out = vec![0u8; 4096];
        let crc = m.read_crc(3, &mut out, 7).unwrap();
        assert_eq!(out, bytes[103..103 + 4096]);
        let mut h = crc32fast::Hasher::new_with_initial(7);
        h.update(&bytes[103..103 + 4096]);
        assert_eq!(crc, h.finalize());
        assert_eq!(m.read_crc(1000, &mut out, 0), Err(AccessError::OutOfBounds));
        assert_eq!(m.read_crc(usize::MAX, &mut out, 0), Err(AccessError::OutOfBounds));
        // Into far lines: the CRC over the source, then the copy; the same bytes and CRC, the
        // same refusals, and the order ends with the scope.
        for len in [1, 255, 256, 1000, 4096] {
            let mut far = vec![0u8; len];
            let got = to_far_lines(|| m.read_crc(3, &mut far, 7)).unwrap();
            assert_eq!(far, bytes[103..103 + len]);
            let mut h = crc32fast::Hasher::new_with_initial(7);
            h.update(&bytes[103..103 + len]);
            assert_eq!(got, h.finalize(), "len {len}");
        }
        assert_eq!(to_far_lines(|| m.read_crc(1000, &mut out, 0)), Err(AccessError::OutOfBounds));
        assert!(!FAR_LINES.with(Cell::get));
    }

    #[test]
    fn a_write_past_the_window_is_refused_and_touches_nothing() {
        let region = Arc::new(Region::owned(vec![0; 4096]));
        let m = MemRef::new(&region, 1, 1024, 2048);
        assert_eq!(m.write(1, &[1u8; 2048]), Err(AccessError::OutOfBounds));
        assert_eq!(m.write(usize::MAX, &[1u8; 2]), Err(AccessError::OutOfBounds));
        let mut back = vec![9u8; 4096];
        MemRef::new(&region, 1, 0, 4096).read(0, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0));
    }
}
