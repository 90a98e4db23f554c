//! Registered memory as the HCA addresses it: the bytes of a region (`Region`) and a checked
//! window into them ([`MemRef`]), the only way the transport touches application memory. Both
//! the verbs layer (which registers regions and checks keys) and the transport (which copies
//! and runs atomics) import this; it imports nothing of theirs.
//!
//! Registered memory is only ever touched through raw pointers, never through `&[u8]`: a
//! remote peer may write it at any moment, as a DMA engine would, so softhca never holds a
//! Rust reference to it while a region exists.

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
}

/// The memory of one registered region: `len` bytes at `ptr`, which is also the region's
/// virtual address (`iova == addr`).
pub(crate) struct Region {
    ptr: NonNull<u8>,
    len: usize,
    /// The region owns its buffer (registered from a `Vec`) and frees it when dropped.
    owned: bool,
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
        Region { ptr, len, owned: true }
    }

    /// A region over memory the caller owns; `None` for a null `addr`.
    ///
    /// # Safety
    /// `addr..addr+len` must stay valid for reads and writes for as long as the region (and
    /// every `MemRef` into it) lives, and the caller accepts concurrent writes by softhca and
    /// remote peers, as from a DMA engine.
    pub unsafe fn borrowed(addr: *mut u8, len: usize) -> Option<Region> {
        Some(Region { ptr: NonNull::new(addr)?, len, owned: false })
    }

    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
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

/// A checked window into a region: what an access check grants (`verbs::Context::check_access`). Holding it keeps the
/// memory alive even if the MR is deregistered meanwhile.
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

/// Writes into registered memory of at least this many bytes may bypass the cache (see
/// [`STREAM_REGION_MIN`]); shorter ones (headers, small Sends, what the application reads at
/// once) go through it as usual.
pub const STREAM_MIN: usize = 1024;

/// Only a region at least this large is written with non-temporal stores: one whose lines a
/// stream of writes is unlikely to find in the cache. Measured on the 2-vCPU development
/// machine (`softhca perf write --link shm --busy-poll`, the landing region 2 × depth × 64 KiB,
/// five pairs each): streaming loses at 2 MiB (0.80x) and 4 MiB (0.76x) and wins at 8 MiB
/// (1.11x) and 16 MiB (1.09–1.40x); perftest's `ib_write_bw` (a 64 KiB buffer written over
/// and over) ran 1.6x faster without it. An HCA's DMA writes land in the last-level cache
/// (DDIO) or memory; rxe's are plain copies.
pub const STREAM_REGION_MIN: usize = 8 << 20;

/// Copies `src` to `dst`, with `stream` as an HCA's DMA engine writes host memory: a long run
/// with non-temporal stores, so that the destination's lines are written without first being
/// read into the cache (on the two-process Write benchmark, where the landing buffers are
/// far larger than the cache, those reads were half of the receiving engine's time).
///
/// Streaming stores are weakly ordered, among themselves and against ordinary ones. A store
/// fence follows the streamed run, and the last 16 to 31 bytes are written after it with
/// ordinary stores: a program that polls the last byte of a buffer for a Write's arrival
/// (perftest's `ib_write_lat`, eager protocols) sees it only once every byte before it is
/// there, as with the plain copy; and everything the transport publishes after the copy (a
/// completion, an ACK, an unlocked mutex) is ordered behind all of it.
///
/// # Safety
/// `dst` must be valid for `src.len()` bytes of writes and not overlap `src`.
#[inline]
unsafe fn copy_in(dst: *mut u8, src: &[u8], stream: bool) {
    #[cfg(target_arch = "x86_64")]
    if stream && src.len() >= STREAM_MIN {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        // A head up to the first 16-byte boundary (ordinary stores), 16-byte streaming
        // stores that stop at least 16 bytes short of the end, the fence, the rest.
        let head = dst.align_offset(16).min(src.len());
        let body = src.len().saturating_sub(head + 16) / 16 * 16;
        // SAFETY (of every call below): all offsets stay below `src.len()`, inside both
        // buffers (the caller's contract); `dst + head` is 16-byte aligned, as
        // `_mm_stream_si128` needs; SSE2 is part of x86_64.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), dst, head);
            for at in (head..head + body).step_by(16) {
                let v = _mm_loadu_si128(src.as_ptr().add(at).cast::<__m128i>());
                _mm_stream_si128(dst.add(at).cast::<__m128i>(), v);
            }
            _mm_sfence();
            let done = head + body;
            std::ptr::copy_nonoverlapping(src.as_ptr().add(done), dst.add(done), src.len() - done);
        }
        return;
    }
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
}

impl MemRef {
    /// `len` bytes at `offset` of `mem`; the caller has checked they lie inside it.
    pub(crate) fn new(mem: &Arc<Region>, key: u32, offset: usize, len: usize) -> MemRef {
        debug_assert!(offset.checked_add(len).is_some_and(|end| end <= mem.len));
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
        let end = at.checked_add(src.len()).ok_or(AccessError::OutOfBounds)?;
        if end > self.len {
            return Err(AccessError::OutOfBounds);
        }
        // SAFETY: offset + at + src.len() <= offset + len <= mem.len (checked above and by
        // the access check that made this MemRef), so the destination lies inside the live
        // allocation, which `self.mem` keeps alive; `src` is a caller's slice, which cannot
        // overlap registered memory that softhca never lends out as a slice.
        unsafe { copy_in(self.mem.ptr.as_ptr().add(self.offset + at), src, self.mem.len >= STREAM_REGION_MIN) };
        Ok(())
    }

    /// Copies from the window at `at` into `dst`.
    pub fn read(&self, at: usize, dst: &mut [u8]) -> std::result::Result<(), AccessError> {
        let end = at.checked_add(dst.len()).ok_or(AccessError::OutOfBounds)?;
        if end > self.len {
            return Err(AccessError::OutOfBounds);
        }
        // SAFETY: as in `write`, the source range is inside the live allocation and `dst` is a
        // distinct caller-owned buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(self.mem.ptr.as_ptr().add(self.offset + at), dst.as_mut_ptr(), dst.len());
        }
        Ok(())
    }

    /// The 8-byte word at the start of the window, for atomics. `None` unless the window is
    /// 8 bytes long and 8-byte aligned (ERR-RQ-5 is checked by the responder before this).
    pub fn atomic_u64(&self) -> Option<&AtomicU64> {
        let p = self.mem.ptr.as_ptr().wrapping_add(self.offset);
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

    /// Every alignment of the destination and every length around the streaming threshold
    /// lands exactly the source bytes, and nothing outside the window, in a region written
    /// through the cache and in one written around it.
    #[test]
    fn writes_land_exactly_at_every_alignment_and_length() {
        for size in [8192, STREAM_REGION_MIN] {
            writes_land_exactly(&Arc::new(Region::owned(vec![0xEE; size])));
        }
    }

    fn writes_land_exactly(region: &Arc<Region>) {
        let src: Vec<u8> = (0..6000u32).map(|i| (i * 7 + 3) as u8).collect();
        for at in [0usize, 1, 7, 15, 16, 33, 64, 1000] {
            for len in [0usize, 1, 15, 16, 17, STREAM_MIN - 1, STREAM_MIN, STREAM_MIN + 1, 4096, 4111, 6000] {
                let m = MemRef::new(region, 1, 0, 8192);
                m.write(0, &[0xEE; 8192]).unwrap();
                if at + len > 8192 {
                    continue;
                }
                m.write(at, &src[..len]).unwrap();
                let mut back = vec![0u8; 8192];
                m.read(0, &mut back).unwrap();
                assert!(back[..at].iter().all(|&b| b == 0xEE), "before the window: at {at} len {len}");
                assert_eq!(&back[at..at + len], &src[..len], "at {at} len {len}");
                assert!(back[at + len..].iter().all(|&b| b == 0xEE), "after the window: at {at} len {len}");
            }
        }
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
